"""Shared fixtures of the LLM tests: a tiny random Llama with LoRA, and hand-written preference pairs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from llm_runs.data import PreferencePair  # noqa: E402
from llm_runs.models import add_lora, tiny_llama  # noqa: E402
from llm_runs.objectives import DPOSettings, PreferenceModel  # noqa: E402

PROMPTS = [
    ("p0", "Explain why the sky is blue."),
    ("p1", "List three fruits."),
]
RESPONSES = {
    "p0": ["Sunlight scatters off air molecules; blue light scatters most.", "Because it is.",
           "The sky looks blue because short wavelengths are scattered more strongly by the atmosphere."],
    "p1": ["Apple, banana, cherry.", "1. Mango\n2. Pear\n3. Plum", "Fruits are nice."],
}


def make_pairs(objective: str, order: tuple[tuple[int, int], ...]) -> list[PreferencePair]:
    """Pairs (chosen index, rejected index) on every prompt."""
    pairs = []
    for pid, prompt in PROMPTS:
        for c, r in order:
            pairs.append(PreferencePair(objective, pid, prompt, RESPONSES[pid][c], RESPONSES[pid][r], 1.0, c, r))
    return pairs


def tiny_preference_model(*, dtype=None, settings: DPOSettings | None = None, perturb: float = 0.05, seed: int = 0):
    """A float64 tiny Llama with LoRA whose B matrices are moved off 0 (so every LoRA matrix has a gradient)."""
    dtype = dtype or torch.float64
    model, tok = tiny_llama(seed=seed, dtype=dtype)
    peft_model = add_lora(model)
    pm = PreferenceModel(peft_model, tok, settings or DPOSettings(max_response_tokens=24))
    if perturb:
        gen = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for p in pm.params:
                p.add_(perturb * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return pm
