r"""Sampling responses from a chat model, several prompts per call, with a wall-clock deadline per call.

A ``generate`` call on this kind of machine has been seen to stall for minutes (malloc re-mapping of freed
tensors). :class:`DeadlineCriteria` is a ``StoppingCriteria`` that ends the call once its deadline has passed;
the responses of such a call are kept and marked ``cut_off = "timeout"`` (a response that reaches
``max_new_tokens`` is ``"length"``; one that ends with the end-of-sequence token is ``finished``).

Prompts go through the tokenizer's chat template (one user turn, generation prompt added), left-padded so a
batch of prompts shares one call. Sampling is seeded per call (``seed`` of the settings and the index of the
call), so a resumed build draws what an uninterrupted one would.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

__all__ = ["DeadlineCriteria", "GenerationSettings", "Response", "generate_responses"]


@dataclass(frozen=True)
class GenerationSettings:
    """Sampling settings of the candidate responses (recorded in the data file)."""

    responses_per_prompt: int = 4
    max_new_tokens: int = 256
    temperature: float = 0.9
    top_p: float = 0.95
    seed: int = 0
    timeout_s: float = 300.0
    prompts_per_call: int = 4

    def __post_init__(self):
        for name in ("responses_per_prompt", "max_new_tokens", "prompts_per_call"):
            v = getattr(self, name)
            if int(v) != v or v < 1:
                raise ValueError(f"generation setting {name} must be a positive integer, got {v!r}")
        if not self.temperature > 0:
            raise ValueError(f"generation setting temperature must be > 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"generation setting top_p must lie in (0, 1], got {self.top_p!r}")
        if not self.timeout_s > 0:
            raise ValueError(f"generation setting timeout_s must be > 0, got {self.timeout_s!r}")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Response:
    """One sampled response: its text, its number of new tokens, and how it ended."""

    text: str
    n_tokens: int
    finished: bool  # ended with the end-of-sequence token
    cut_off: str | None  # None (finished), "length" (max_new_tokens reached) or "timeout" (deadline passed)

    def to_dict(self) -> dict:
        return asdict(self)


class DeadlineCriteria:
    """Stop every sequence of a ``generate`` call once ``time.monotonic()`` passes ``deadline``.

    A stopping criterion in the sense of transformers (a callable of ``(input_ids, scores)`` returning one bool
    per sequence); it does not subclass ``transformers.StoppingCriteria`` so that this module imports without
    torch or transformers (the command line reads the settings' defaults from it).
    """

    def __init__(self, deadline: float):
        self.deadline = float(deadline)
        self.fired = False

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        over = time.monotonic() > self.deadline
        self.fired = self.fired or over
        return torch.full((input_ids.shape[0],), over, dtype=torch.bool, device=input_ids.device)


def chat_inputs(tokenizer, prompts: list[str], device) -> dict:
    """Left-padded chat-template encodings of ``prompts`` (one user turn each, generation prompt added)."""
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        for p in prompts
    ]
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    finally:
        tokenizer.padding_side = side
    return {k: v.to(device) for k, v in enc.items()}


def generate_responses(model, tokenizer, prompts: list[str], settings: GenerationSettings, call_index: int = 0):
    """Sample ``settings.responses_per_prompt`` responses to each prompt in one ``generate`` call.

    Returns ``(responses, seconds)``: ``responses[i]`` is the list of :class:`Response` of ``prompts[i]``.
    """
    import torch

    if not prompts:
        raise ValueError("generate_responses needs at least one prompt")
    device = next(model.parameters()).device
    enc = chat_inputs(tokenizer, prompts, device)
    eos = tokenizer.eos_token_id
    deadline = DeadlineCriteria(time.monotonic() + settings.timeout_s)
    gen_device = device.type if device.type == "cuda" else "cpu"
    start = time.monotonic()
    with torch.random.fork_rng(devices=[device] if gen_device == "cuda" else []):
        torch.manual_seed(settings.seed * 1_000_003 + call_index)
        with torch.no_grad():
            out = model.generate(
                **enc,
                do_sample=True,
                temperature=settings.temperature,
                top_p=settings.top_p,
                top_k=0,
                max_new_tokens=settings.max_new_tokens,
                num_return_sequences=settings.responses_per_prompt,
                eos_token_id=eos,
                pad_token_id=tokenizer.pad_token_id,
                stopping_criteria=[deadline],
            )
    seconds = time.monotonic() - start
    new = out[:, enc["input_ids"].shape[1] :].cpu()
    k = settings.responses_per_prompt
    responses: list[list[Response]] = [[] for _ in prompts]
    for row in range(new.shape[0]):
        ids = new[row].tolist()
        finished = eos in ids
        n = ids.index(eos) if finished else len(ids)
        if finished:
            cut = None
        elif n >= settings.max_new_tokens:
            cut = "length"
        else:
            cut = "timeout"
        if deadline.fired and not finished:
            cut = "timeout"
        text = tokenizer.decode(ids[:n], skip_special_tokens=True).strip()
        responses[row // k].append(Response(text=text, n_tokens=n, finished=finished, cut_off=cut))
    return responses, seconds
