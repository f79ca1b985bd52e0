r"""Per-objective preference losses and their gradients over the LoRA parameters (the torch side of the LP step).

**Loss.** For a preference pair ``(x, y_w, y_l)`` of objective ``j`` and the policy ``π_θ`` (the LoRA-adapted
model) against the reference ``π_ref`` (the same model with the adapter disabled), with sequence log-probability
``s(y) = (1/|y|) Σ_t log π(y_t | x, y_<t)`` (length-normalised; the sum if ``length_normalise=False``)::

    z   = β · [(s_θ(y_w) - s_θ(y_l)) - (s_ref(y_w) - s_ref(y_l))]
    ℓ   = -(1-ε) log σ(z) - ε log σ(-z)                         (conservative DPO, label smoothing ε)
    l_j = mean of ℓ over the objective's pairs

``ℓ`` is minimal at ``σ(z) = 1-ε`` where it equals the binary entropy ``H(ε) = -(1-ε)log(1-ε) - ε log ε``, so
``l_j >= H(ε) > 0`` for ``ε > 0``: the losses stay bounded away from 0, which the preference uniformity
``β_i = KL(l̂_i ‖ 1/m)`` and the LP need (plain DPO, ``ε = 0``, is driven to 0 by a few memorised pairs). At the
LoRA initialisation (``B = 0``) the policy equals the reference, ``z = 0`` and ``l_j = ln 2``.

**One layout, one precision.** The reference log-probabilities of a batch are computed on exactly the batch the
policy runs (the same sequences, padding and order: :meth:`PreferenceModel.reference_map`) and in the same
precision (the training autocast for training losses and gradients, the model's own float32 for held-out
evaluation), and cached per batch. At the LoRA initialisation policy and reference are then the same
computation, so every margin is exactly 0 and every loss ``ln 2`` (a reference cached from other batches or
another dtype was off ``ln 2`` by up to 7.3e-3 nats under bf16 autocast, the size of the held-out changes it
was meant to measure). Log-probabilities are computed on response positions only (the LM head and the
log-softmax are applied to those hidden states alone).

**Guard.** A loss that is not finite, or that lies within ``floor_rtol`` (relative) of its floor ``H(ε)``,
raises :class:`ObjectiveLossError` naming the objective (the caller adds client, phase and round).

**Gradients at the kernel boundary.** :func:`objective_gradients` returns, for one client and its
per-objective batches, the loss vector ``l`` (m, float64 on the host), the gradients ``G`` (n_lora × m, a tensor
on the model's device; column ``j`` is ``∇_θ l_j`` flattened over the LoRA parameters in a fixed order), the
Gram matrix ``C = GᵀG`` (m × m, float64 on the host, formed on the device) and :meth:`ObjectiveGradients.combine`,
which forms ``d = G μ`` on the device and applies a step to the LoRA parameters. Three layouts compute ``G``:

``"separate"``  one forward and one backward per objective over that objective's sequences;
``"shared"``    one forward over the union of the sequences of all objectives and one batched
                vector-Jacobian product (``torch.autograd.grad(..., is_grads_batched=True)``) for the m losses;
``"shared_loop"`` one forward over the union and m backward passes through it;
``"sequence"``  one forward and one backward per *distinct* sequence: every loss is a function of the
                sequence log-probabilities ``s``, so ``G = Σ_y ∇_θ s(y) (∂l/∂s(y))ᵀ``; a sequence that several
                objectives' pairs share (the pairs of all objectives are built on the same few responses per
                prompt) runs through the model once instead of once per objective.

They give the same ``G`` up to round-off; ``benchmarks`` (``tests/llm_runs/test_llm_bench.py``) compares their speed.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from llm_runs.model.models import lora_parameters

__all__ = [
    "LAYOUTS",
    "TIE_ATOL",
    "DPOSettings",
    "ObjectiveGradients",
    "ObjectiveLossError",
    "PreferenceModel",
    "binary_entropy",
    "check_weights",
    "objective_gradients",
    "objective_losses",
    "pair_accuracy",
]

def _cache_argument(decoder) -> str:
    """The decoder's keyword for a key-value cache: ``cache`` in transformers 5.2x's decoders, ``past_key_values``
    in others."""
    import inspect

    return "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"


LAYOUTS = ("separate", "shared", "shared_loop", "sequence")
#: The layout :func:`objective_gradients` uses unless told otherwise. "separate" needs the least memory (the
#: batched VJP of "shared" holds m copies of the backward: about 9.6 GB RSS for m = 5 on 8 sequences of about
#: 290 tokens with SmolLM2-135M). A run picks its layout per device (:func:`llm_runs.training.source.default_layout`);
#: the benchmark in tests/llm_runs/test_llm_bench.py compares the layouts on this package's data layout (every
#: objective's pairs on the same candidates) and prints the fastest.
DEFAULT_LAYOUT = "separate"


#: A held-out pair whose margin ``z/β`` lies within this of 0 is a tie (:func:`pair_accuracy`).
TIE_ATOL = 1e-6


def pair_accuracy(margin, tie_atol: float = TIE_ATOL):
    """Per pair 1 if its margin ``z/β > tie_atol``, 1/2 if ``|z/β| <= tie_atol`` (a tie), else 0: the preference
    accuracy of :meth:`PreferenceModel.evaluate` (a float64 tensor for a tensor, an array for an array); the base
    model (every margin 0) scores 1/2."""
    if isinstance(margin, torch.Tensor):
        return (margin > tie_atol).double() + 0.5 * (margin.abs() <= tie_atol).double()
    margin = np.asarray(margin, dtype=np.float64)
    return (margin > tie_atol) + 0.5 * (np.abs(margin) <= tie_atol)


def binary_entropy(eps: float) -> float:
    """``H(ε) = -(1-ε) ln(1-ε) - ε ln ε`` (nats), with ``H(0) = 0``."""
    if eps == 0:
        return 0.0
    return -(1 - eps) * math.log1p(-eps) - eps * math.log(eps)


@dataclass(frozen=True)
class DPOSettings:
    """Settings of the per-objective conservative DPO loss.

    ``beta`` (β, the inverse temperature of the implicit reward), ``label_smoothing`` (ε in [0, 0.5); the loss
    floor is ``H(ε)``), ``length_normalise`` (mean instead of sum of token log-probabilities),
    ``max_response_tokens`` (longer responses are truncated; the end-of-turn token is always appended),
    ``floor_rtol`` (a loss within this relative distance of its floor raises), ``autocast`` (``None`` or a
    lower-precision dtype such as ``torch.bfloat16`` for the forward and backward passes).
    """

    beta: float = 1.0
    label_smoothing: float = 0.1
    length_normalise: bool = True
    max_response_tokens: int = 256
    floor_rtol: float = 1e-6
    autocast: torch.dtype | None = None

    def __post_init__(self):
        if not (self.beta > 0 and math.isfinite(self.beta)):
            raise ValueError(f"DPO beta must be a finite number > 0, got {self.beta!r}")
        if not 0 <= self.label_smoothing < 0.5:
            raise ValueError(f"DPO label_smoothing must lie in [0, 0.5), got {self.label_smoothing!r}")
        if int(self.max_response_tokens) != self.max_response_tokens or self.max_response_tokens < 1:
            raise ValueError(f"max_response_tokens must be a positive integer, got {self.max_response_tokens!r}")
        if not self.floor_rtol >= 0:
            raise ValueError(f"floor_rtol must be >= 0, got {self.floor_rtol!r}")

    @property
    def floor(self) -> float:
        """The infimum ``H(ε)`` of the loss."""
        return binary_entropy(self.label_smoothing)


class ObjectiveLossError(FloatingPointError):
    """A per-objective loss is not finite or has reached its floor ``H(ε)`` within round-off; ``client``: the
    client whose loss it is, when known (Algorithm 1 adds the phase, round and step)."""

    def __init__(self, objective: str, value: float, floor: float, reason: str, client: int | None = None):
        self.objective, self.value, self.floor, self.reason, self.client = objective, value, floor, reason, client
        who = "" if client is None else f"client {client}, "
        super().__init__(f"{who}objective {objective!r}: loss {value!r} {reason} (floor H(eps) = {floor!r})")


def check_weights(weights, m: int, name: str = "mu") -> np.ndarray:
    """``weights`` as float64 after checking it is a point of the closed simplex of dimension ``m``."""
    from sim.preference import SIMPLEX_ATOL

    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (m,):
        raise ValueError(f"{name} must have shape ({m},), got {w.shape}")
    if not np.all(np.isfinite(w)):
        raise ValueError(f"{name} contains a non-finite entry: {w.tolist()}")
    if np.any(w < 0):
        raise ValueError(f"{name} must lie in the simplex (entries >= 0); got {w.tolist()}")
    if abs(w.sum() - 1.0) > SIMPLEX_ATOL:
        raise ValueError(f"{name} must sum to 1 (simplex); {w.tolist()} sums to {float(w.sum())!r}")
    return w


# --------------------------------------------------------------------------------------------------------------


def _pair_key(pair) -> tuple[tuple[str, str], tuple[str, str]]:
    return (pair.prompt, pair.chosen), (pair.prompt, pair.rejected)


class PreferenceModel:
    """A LoRA policy and its adapter-disabled reference: sequence log-probabilities and DPO losses.

    ``model`` is a peft model (see :func:`llm_runs.model.models.add_lora`); its trainable parameters are the LoRA
    matrices, flattened in name order into the rows of ``G``. Tokenisations and reference log-probabilities are
    cached per distinct ``(prompt, response)``.
    """

    def __init__(self, model, tokenizer, settings: DPOSettings | None = None):
        if not hasattr(model, "disable_adapter"):
            raise TypeError("PreferenceModel needs a peft model (wrap it with llm_runs.model.models.add_lora)")
        self.model = model
        self.tokenizer = tokenizer
        self.settings = settings or DPOSettings()
        self.params = lora_parameters(model)
        if not self.params:
            raise ValueError("the model has no trainable (LoRA) parameters")
        self.sizes = [p.numel() for p in self.params]
        self.n_params = int(sum(self.sizes))
        self.device = self.params[0].device
        self.dtype = self.params[0].dtype
        base = model.get_base_model()
        self._decoder = base.get_decoder()
        self._head = base.get_output_embeddings()
        self._tokens: dict[tuple[str, str], tuple[list[int], int]] = {}
        self._prompt_tokens: dict[str, list[int]] = {}
        # reference log-probabilities per (chunk of keys, evaluation precision): see reference_map
        self._ref: dict[tuple, torch.Tensor] = {}
        self.tokens_processed = 0  # tokens of every sequence batch the model has run (policy and reference)

    # ---- tokens ---------------------------------------------------------------------------------------------
    def _encode(self, key: tuple[str, str]) -> tuple[list[int], int]:
        hit = self._tokens.get(key)
        if hit is not None:
            return hit
        prompt, response = key
        tok = self.tokenizer
        if prompt not in self._prompt_tokens:
            self._prompt_tokens[prompt] = tok.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=True, add_generation_prompt=True,
                return_dict=False,
            )
        p_ids = list(self._prompt_tokens[prompt])
        r_ids = tok(response, add_special_tokens=False)["input_ids"][: self.settings.max_response_tokens]
        out = (p_ids + r_ids + [tok.eos_token_id], len(p_ids))
        self._tokens[key] = out
        return out

    def _batch(self, keys):
        enc = [self._encode(k) for k in keys]
        T = max(len(ids) for ids, _ in enc)
        self.tokens_processed += sum(len(ids) for ids, _ in enc)
        pad = self.tokenizer.pad_token_id
        ids = torch.full((len(enc), T), pad, dtype=torch.long)
        attn = torch.zeros((len(enc), T), dtype=torch.long)
        target = torch.zeros((len(enc), T), dtype=torch.bool)  # position t predicts token t+1 of the response
        for b, (seq, n_prompt) in enumerate(enc):
            ids[b, : len(seq)] = torch.tensor(seq)
            attn[b, : len(seq)] = 1
            target[b, n_prompt - 1 : len(seq) - 1] = True
        return ids.to(self.device), attn.to(self.device), target.to(self.device)

    def _autocast(self):
        if self.settings.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.settings.autocast)

    # ---- log-probabilities ----------------------------------------------------------------------------------
    def _precision(self, evaluation: bool):
        """Training passes run under the settings' autocast; evaluation passes in the model's own dtype."""
        if evaluation:
            return contextlib.nullcontext()
        return self._autocast()

    def sequence_logps(self, keys: Sequence[tuple[str, str]], *, evaluation: bool = False) -> torch.Tensor:
        """Policy log-probabilities ``s_θ(y)`` of the responses ``keys``, run as **one** padded batch (with gradient
        unless called under ``torch.no_grad``), float64 ``(len(keys),)``. ``evaluation``: in the model's own dtype
        (float32) instead of under the training autocast."""
        ids, attn, target = self._batch(keys)
        with self._precision(evaluation):
            hidden = self._decoder(input_ids=ids, attention_mask=attn, use_cache=False).last_hidden_state
            h = hidden[target]
            logits = self._head(h)
        tgt = ids[:, 1:][target[:, :-1]]
        if logits.dtype not in (torch.float32, torch.float64):
            logits = logits.float()
        tok_logp = -torch.nn.functional.cross_entropy(logits, tgt, reduction="none")
        seq_index = torch.nonzero(target, as_tuple=True)[0]
        sums = torch.zeros(len(keys), dtype=torch.float64, device=self.device)
        sums = sums.index_add(0, seq_index, tok_logp.double())
        if not self.settings.length_normalise:
            return sums
        counts = target.sum(dim=1).to(torch.float64)
        return sums / counts

    def reference_map(self, chunks: Sequence[Sequence[tuple[str, str]]], *, evaluation: bool = False
                      ) -> dict[tuple[str, str], torch.Tensor]:
        """Reference log-probabilities ``s_ref(y)`` (adapter disabled) of every key of ``chunks``, each chunk run as
        one padded batch **exactly as the policy runs it** (the same sequences in the same order, the same
        precision): at the LoRA initialisation (``B = 0``) policy and reference are then the same computation and
        every margin is 0. Cached per chunk and precision; a chunk seen before is not run again."""
        out: dict[tuple[str, str], torch.Tensor] = {}
        for chunk in chunks:
            ck = (tuple(chunk), bool(evaluation))
            hit = self._ref.get(ck)
            if hit is None:
                with torch.no_grad(), self.model.disable_adapter():
                    hit = self.sequence_logps(list(chunk), evaluation=evaluation).detach()
                self._ref[ck] = hit
            for k, v in zip(chunk, hit, strict=True):
                out[k] = v
        return out

    def grouped_logps(self, keys: Sequence[tuple[str, str]], *, evaluation: bool = True) -> torch.Tensor:
        """Sequence log-probabilities ``s(y)`` of ``keys`` without gradients, float64 ``(len(keys),)``, with every
        prompt run **once**: the prompt's key-value cache is computed in one pass and the prompt's responses run
        on from it as one right-padded batch (a held-out set of a few responses per prompt costs about the
        response tokens plus one prompt per prompt, not a prompt per response). Under the adapter's
        ``disable_adapter`` context this is the reference; policy and reference computed this way are the same
        computation at the LoRA initialisation, so every margin there is exactly 0. ``evaluation``: in the
        model's own dtype (float32) instead of the training autocast. Agrees with :meth:`sequence_logps` up to the
        round-off of another summation order."""
        keys = list(keys)
        out = torch.empty(len(keys), dtype=torch.float64)
        groups: dict[str, list[int]] = {}
        for idx, (prompt, _) in enumerate(keys):
            groups.setdefault(prompt, []).append(idx)
        pad = self.tokenizer.pad_token_id
        with torch.no_grad(), self._precision(evaluation):
            for idxs in groups.values():
                enc = [self._encode(keys[i]) for i in idxs]
                n_prompt = enc[0][1]
                prompt_ids = torch.tensor([enc[0][0][:n_prompt]], dtype=torch.long, device=self.device)
                resp = [ids[n_prompt:] for ids, _ in enc]  # response tokens and the closing eos
                B, L = len(resp), max(len(r) for r in resp)
                self.tokens_processed += n_prompt + sum(len(r) for r in resp)
                first = self._decoder(input_ids=prompt_ids, use_cache=True)
                cache = first.past_key_values
                cache.batch_repeat_interleave(B)
                cached = {_cache_argument(self._decoder): cache}
                r_ids = torch.full((B, L), pad, dtype=torch.long)
                r_mask = torch.zeros((B, L), dtype=torch.bool)
                for b, r in enumerate(resp):
                    r_ids[b, : len(r)] = torch.tensor(r)
                    r_mask[b, : len(r)] = True
                r_ids, r_mask = r_ids.to(self.device), r_mask.to(self.device)
                attn = torch.cat([torch.ones((B, n_prompt), dtype=torch.long, device=self.device),
                                  r_mask.long()], dim=1)
                hid = self._decoder(input_ids=r_ids, attention_mask=attn, use_cache=False,
                                    **cached).last_hidden_state
                # response token k is predicted by the hidden state before it: the prompt's last for k = 0
                pred = torch.cat([first.last_hidden_state[:, -1:].expand(B, 1, -1), hid[:, :-1]], dim=1)
                logits = self._head(pred[r_mask])
                if logits.dtype not in (torch.float32, torch.float64):
                    logits = logits.float()
                tok_logp = -torch.nn.functional.cross_entropy(logits, r_ids[r_mask], reduction="none")
                seq_index = torch.nonzero(r_mask, as_tuple=True)[0]
                sums = torch.zeros(B, dtype=torch.float64, device=self.device).index_add(0, seq_index,
                                                                                      tok_logp.double())
                if self.settings.length_normalise:
                    sums = sums / r_mask.sum(dim=1).to(torch.float64)
                out[torch.tensor(idxs)] = sums.cpu()
        return out

    def grouped_pair_losses(self, batches: Mapping[str, Sequence], *, evaluation: bool = True) -> dict[str, tuple]:
        """Per objective, the per-pair losses and margins ``(ℓ, z)`` (float64) of its pairs, every distinct
        sequence of all objectives computed once by :meth:`grouped_logps` for the policy and (cached per set of
        sequences) for the reference, so that the base model's margins are exactly 0: the held-out evaluation of
        many models on one large held-out set (``z`` is the implicit-reward margin ``β[(s_θ(y_w) − s_ref(y_w)) −
        (s_θ(y_l) − s_ref(y_l))]``)."""
        for name, pairs in batches.items():
            if not pairs:
                raise ValueError(f"objective {name!r} has no evaluation pairs")
        keys = tuple(dict.fromkeys(k for pairs in batches.values() for p in pairs for k in _pair_key(p)))
        s = self.grouped_logps(keys, evaluation=evaluation)
        ck = (("grouped",) + keys, bool(evaluation))
        ref_s = self._ref.get(ck)
        if ref_s is None:
            with self.model.disable_adapter():
                ref_s = self.grouped_logps(keys, evaluation=evaluation)
            self._ref[ck] = ref_s
        logp = {k: s[i] for i, k in enumerate(keys)}
        ref = {k: ref_s[i] for i, k in enumerate(keys)}
        return {name: self.pair_losses(pairs, logp, ref) for name, pairs in batches.items()}

    # ---- losses ---------------------------------------------------------------------------------------------
    def pair_losses(self, pairs, logp: Mapping[tuple[str, str], torch.Tensor] | None = None,
                    ref: Mapping[tuple[str, str], torch.Tensor] | None = None):
        """Per-pair losses ``ℓ`` and margins ``z`` (float64 tensors) of ``pairs``.

        ``logp`` and ``ref`` map sequence keys to the policy and reference log-probabilities already computed in
        one layout (:meth:`reference_map` of the policy's chunks); by default both are computed here with the
        pairs' distinct sequences as one batch, in the training precision."""
        keys = [k for p in pairs for k in _pair_key(p)]
        if (logp is None) != (ref is None):
            raise ValueError("give both the policy (logp) and the reference (ref) log-probabilities, or neither")
        if logp is None:
            uniq = list(dict.fromkeys(keys))
            s = self.sequence_logps(uniq)
            logp = {k: s[i] for i, k in enumerate(uniq)}
            ref = self.reference_map([uniq])
        assert ref is not None
        pol = torch.stack([logp[k] for k in keys]).view(-1, 2)
        rf = torch.stack([ref[k] for k in keys]).view(-1, 2)
        z = self.settings.beta * ((pol[:, 0] - pol[:, 1]) - (rf[:, 0] - rf[:, 1]))
        eps = self.settings.label_smoothing
        loss = -(1 - eps) * torch.nn.functional.logsigmoid(z) - eps * torch.nn.functional.logsigmoid(-z)
        return loss, z

    def check_loss(self, objective: str, value: float) -> None:
        """Raise :class:`ObjectiveLossError` if ``value`` is not finite or lies at the floor within round-off."""
        floor = self.settings.floor
        if not math.isfinite(value):
            raise ObjectiveLossError(objective, value, floor, "is not finite")
        if value - floor <= self.settings.floor_rtol * max(floor, 1.0):
            raise ObjectiveLossError(objective, value, floor, f"reached its floor (within rtol {self.settings.floor_rtol})")

    # ---- flat views of the LoRA parameters --------------------------------------------------------------------
    def flat_grad(self, grads) -> torch.Tensor:
        """Concatenate per-parameter gradients (``None`` as zeros) into one flat vector."""
        return torch.cat([
            (g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, self.params, strict=True)
        ])

    def flat_params(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.params])

    def apply_flat(self, d: torch.Tensor, *, step_size: float | None = None, optimizer=None) -> None:
        """Step along ``-d``: ``θ ← θ - step_size·d``, or hand ``d`` to ``optimizer`` as the gradient."""
        if (step_size is None) == (optimizer is None):
            raise ValueError("give exactly one of step_size and optimizer")
        if d.shape != (self.n_params,):
            raise ValueError(f"direction has shape {tuple(d.shape)}, expected ({self.n_params},)")
        chunks = torch.split(d, self.sizes)
        with torch.no_grad():
            if optimizer is None:
                if not (step_size > 0 and math.isfinite(step_size)):
                    raise ValueError(f"step_size must be a finite number > 0, got {step_size!r}")
                for p, c in zip(self.params, chunks, strict=True):
                    p.add_(c.view_as(p).to(p.dtype), alpha=-step_size)
            else:
                for p, c in zip(self.params, chunks, strict=True):
                    p.grad = c.view_as(p).to(p.dtype).clone()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

    # ---- evaluation -----------------------------------------------------------------------------------------
    def evaluate(self, batches: Mapping[str, Sequence], batch_size: int = 16, tie_atol: float = TIE_ATOL
                 ) -> dict[str, dict]:
        """Held-out loss and preference accuracy per objective, in the model's own dtype (float32: no autocast).

        A pair counts 1 if its margin ``z/β > tie_atol``, 1/2 if ``|z/β| <= tie_atol`` (a tie), else 0. Policy
        and reference run the same batches in the same precision (:meth:`reference_map`), so at the LoRA
        initialisation every margin is 0 and every loss ``ln 2``.
        """
        out = {}
        for name, (loss, z) in self.batch_pair_losses(batches, batch_size, evaluation=True).items():
            acc = pair_accuracy(z / self.settings.beta, tie_atol).mean()
            out[name] = {"loss": float(loss.mean()), "accuracy": float(acc), "pairs": len(batches[name])}
        return out

    def batch_pair_losses(self, batches: Mapping[str, Sequence], batch_size: int = 16, *, evaluation: bool = False
                          ) -> dict[str, tuple]:
        """Per objective, the per-pair losses and margins ``(ℓ, z)`` of its pairs, without gradients; every distinct
        sequence of all objectives runs through the model once, in chunks of ``batch_size`` (policy and reference
        alike); ``evaluation``: in the model's own dtype instead of the training autocast."""
        for name, pairs in batches.items():
            if not pairs:
                raise ValueError(f"objective {name!r} has no evaluation pairs")
        keys = list(dict.fromkeys(k for pairs in batches.values() for p in pairs for k in _pair_key(p)))
        chunks = [keys[i : i + batch_size] for i in range(0, len(keys), batch_size)]
        with torch.no_grad():
            logp = {}
            for chunk in chunks:
                for k, v in zip(chunk, self.sequence_logps(chunk, evaluation=evaluation), strict=True):
                    logp[k] = v
            ref = self.reference_map(chunks, evaluation=evaluation)
            return {name: self.pair_losses(pairs, logp, ref) for name, pairs in batches.items()}


# --------------------------------------------------------------------------------------------------------------


@dataclass
class ObjectiveGradients:
    """Losses, per-objective gradients and their Gram matrix for one client at the current LoRA parameters.

    ``losses`` (m,) float64 host; ``G`` (n_lora, m) tensor on the model's device; ``gram`` = ``GᵀG`` (m, m)
    float64 host (formed on the device in float64), or None when not asked for.
    """

    objectives: tuple[str, ...]
    losses: np.ndarray
    G: torch.Tensor
    gram: np.ndarray | None
    model: PreferenceModel = field(repr=False)

    def direction(self, mu) -> torch.Tensor:
        """``d = G μ`` on the device, for ``μ`` in the closed simplex (e.g. the LP weights)."""
        w = check_weights(mu, len(self.objectives))
        return self.G @ torch.as_tensor(w, dtype=self.G.dtype, device=self.G.device)

    def combine(self, mu, *, step_size: float | None = None, optimizer=None) -> torch.Tensor:
        """Form ``d = G μ`` on the device and step the LoRA parameters along ``-d``; return ``d``."""
        d = self.direction(mu)
        self.model.apply_flat(d, step_size=step_size, optimizer=optimizer)
        return d


def _gram(G: torch.Tensor) -> np.ndarray:
    Gd = G.to(torch.float64)
    C = (Gd.T @ Gd).cpu().numpy()
    return 0.5 * (C + C.T)


def _check_batches(batches: Mapping[str, Sequence]) -> tuple[str, ...]:
    names = tuple(batches)
    if not names:
        raise ValueError("no objectives: the batches mapping is empty")
    for n in names:
        if not batches[n]:
            raise ValueError(f"objective {n!r} has an empty batch")
    return names


def _section(timer, name: str):
    """``timer.section(name)`` (a :class:`llm_runs.training.source.StepTimer`), or nothing without a timer."""
    return contextlib.nullcontext() if timer is None else timer.section(name)


def _shared_chunks(names, batches, layout: str):
    """The distinct sequences of all objectives' pairs and the batches the policy runs them in: one per sequence
    (``"sequence"``) or their union (``"shared"``, ``"shared_loop"``)."""
    keys = list(dict.fromkeys(k for n in names for p in batches[n] for k in _pair_key(p)))
    return keys, ([[k] for k in keys] if layout == "sequence" else [keys])


def objective_losses(pm: PreferenceModel, batches: Mapping[str, Sequence], *, layout: str = DEFAULT_LAYOUT
                     ) -> np.ndarray:
    """The loss vector ``l`` of :func:`objective_gradients` without its gradients: the same sequences in the same
    batches and precision (policy and reference), so that the two agree exactly. Losses are not checked here."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose one of {LAYOUTS}")
    names = _check_batches(batches)
    with torch.no_grad():
        if layout == "separate":
            return np.array([pm.pair_losses(batches[n])[0].mean().item() for n in names], dtype=np.float64)
        keys, chunks = _shared_chunks(names, batches, layout)
        logp: dict[tuple[str, str], torch.Tensor] = {}
        for c in chunks:
            for k, v in zip(c, pm.sequence_logps(c), strict=True):
                logp[k] = v
        ref = pm.reference_map(chunks)
        return np.array([pm.pair_losses(batches[n], logp, ref)[0].mean().item() for n in names], dtype=np.float64)


def objective_gradients(pm: PreferenceModel, batches: Mapping[str, Sequence], *, layout: str = DEFAULT_LAYOUT,
                        timer=None, gram: bool = True) -> ObjectiveGradients:
    """Per-objective losses ``l``, gradients ``G`` and Gram ``C = GᵀG`` of one client (see the module docstring).

    ``batches`` maps each objective name to its preference pairs (:class:`llm_runs.preferences.data.PreferencePair`) in the
    order of the objectives. Every loss passes :meth:`PreferenceModel.check_loss`. ``timer``: a
    :class:`llm_runs.training.source.StepTimer` that accumulates the ``forward`` (losses) and ``backward`` (gradients)
    time; ``gram=False`` leaves ``gram`` None (a caller that forms the Grams of many clients at once).
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose one of {LAYOUTS}")
    names = _check_batches(batches)
    m = len(names)
    params = pm.params
    if layout == "separate":
        losses, cols = [], []
        for n in names:
            with _section(timer, "forward"):
                loss = pm.pair_losses(batches[n])[0].mean()
                value = loss.item()
            pm.check_loss(n, value)
            with _section(timer, "backward"):
                grads = torch.autograd.grad(loss, params, allow_unused=True)
                cols.append(pm.flat_grad(grads))
            losses.append(value)
        with _section(timer, "backward"):
            G = torch.stack(cols, dim=1)
    else:
        keys, chunks = _shared_chunks(names, batches, layout)
        with _section(timer, "forward"):
            if layout == "sequence":
                seq = [pm.sequence_logps(c)[0] for c in chunks]  # one graph per distinct sequence
                s = torch.stack(seq).detach().requires_grad_(True)
            else:
                s = pm.sequence_logps(keys)  # one graph over the union of the sequences
            logp = {k: s[i] for i, k in enumerate(keys)}
            ref = pm.reference_map(chunks)
            lvec = torch.stack([pm.pair_losses(batches[n], logp, ref)[0].mean() for n in names])
            losses = lvec.detach().cpu().tolist()
        for n, v in zip(names, losses, strict=True):
            pm.check_loss(n, v)
        with _section(timer, "backward"):
            if layout == "sequence":  # G = Σ_y ∇_θ s(y) (∂l/∂s(y))ᵀ, one backward per sequence
                eye = torch.eye(m, dtype=lvec.dtype, device=lvec.device)
                (dl_ds,) = torch.autograd.grad(lvec, s, grad_outputs=eye, is_grads_batched=True)  # (m, n_seq)
                dl_ds = dl_ds.to(pm.dtype)
                G = None
                for i, si in enumerate(seq):
                    g = pm.flat_grad(torch.autograd.grad(si, params, allow_unused=True))
                    G = torch.outer(g, dl_ds[:, i]) if G is None else G.addr_(g, dl_ds[:, i])
            elif layout == "shared":
                eye = torch.eye(m, dtype=lvec.dtype, device=lvec.device)
                grads = torch.autograd.grad(lvec, params, grad_outputs=eye, is_grads_batched=True, allow_unused=True)
                G = torch.cat([
                    (g if g is not None else torch.zeros((m, *p.shape), dtype=p.dtype, device=p.device)).reshape(m, -1)
                    for g, p in zip(grads, params, strict=True)
                ], dim=1).T
            else:
                cols = []
                for j in range(m):
                    grads = torch.autograd.grad(lvec[j], params, retain_graph=j < m - 1, allow_unused=True)
                    cols.append(pm.flat_grad(grads))
                G = torch.stack(cols, dim=1)
    with _section(timer, "backward"):
        G = G.to(pm.dtype).contiguous()
    return ObjectiveGradients(names, np.asarray(losses, dtype=np.float64), G, _gram(G) if gram else None, pm)


def weighted_gradient(pm: PreferenceModel, batches: Mapping[str, Sequence], weights, *,
                      max_pairs: int | None = None) -> tuple[float, torch.Tensor]:
    """Linear scalarisation ``Σ_j λ_j l_j`` and its gradient; ``λ`` in the open simplex.

    ``max_pairs=None``: one forward over every distinct sequence and one backward pass. With ``max_pairs``, the
    pairs of all objectives are taken in chunks of at most that many (objective by objective, in order), each
    chunk's share ``Σ λ_j (1/n_j) Σ_{pairs of j in the chunk} l`` run forward and backward on its own and the
    gradients summed: the same loss and gradient up to roundoff, with the activations of one chunk in memory
    instead of all (a full batch of 4 objectives x 64 pairs of SmolLM2-135M took more than the 11.8 GB a Dask
    worker of a 24 GB machine may use; a sequence shared by pairs of two chunks runs once per chunk)."""
    from sim.preference import check_preferences

    names = _check_batches(batches)
    lam = check_preferences(weights, "weights")
    if lam.shape != (len(names),):
        raise ValueError(f"weights must have shape ({len(names)},), got {lam.shape}")
    if max_pairs is not None and (isinstance(max_pairs, bool) or int(max_pairs) != max_pairs or max_pairs < 1):
        raise ValueError(f"max_pairs must be a positive integer or None; got {max_pairs!r}")
    if max_pairs is None:
        chunks = [[(j, list(batches[n])) for j, n in enumerate(names)]]
    else:
        flat = [(j, p) for j, n in enumerate(names) for p in batches[n]]
        chunks = []
        for i in range(0, len(flat), int(max_pairs)):
            part: dict[int, list] = {}
            for j, p in flat[i : i + int(max_pairs)]:
                part.setdefault(j, []).append(p)
            chunks.append(list(part.items()))
    sums = np.zeros(len(names))
    grad = None
    for chunk in chunks:
        keys = list(dict.fromkeys(k for _, pairs in chunk for p in pairs for k in _pair_key(p)))
        s = pm.sequence_logps(keys)
        logp = {k: s[i] for i, k in enumerate(keys)}
        ref = pm.reference_map([keys])
        part = 0.0
        for j, pairs in chunk:
            losses = pm.pair_losses(pairs, logp, ref)[0]
            loss = losses.mean() if max_pairs is None else losses.sum() / len(batches[names[j]])
            sums[j] += loss.item()
            part = part + float(lam[j]) * loss
        g = pm.flat_grad(torch.autograd.grad(part, pm.params, allow_unused=True))
        grad = g if grad is None else grad + g
    for n, v in zip(names, sums, strict=True):  # each objective's mean loss over all its pairs
        pm.check_loss(n, float(v))
    assert grad is not None  # _check_batches: every objective holds pairs
    return float(lam @ sums), grad


def dpo_step(pm: PreferenceModel, pairs: Sequence, optimizer, objective: str = "objective") -> float:
    """One single-objective conservative-DPO step with a torch optimizer; return the loss before the step."""
    optimizer.zero_grad(set_to_none=True)
    loss = pm.pair_losses(pairs)[0].mean()
    pm.check_loss(objective, loss.item())
    loss.backward()
    optimizer.step()
    return loss.item()
