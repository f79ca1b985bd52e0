"""Shapes of the random Llamas of :func:`llm_runs.models.save_random_llama`, importable without torch (the command
line's parser lists them: building it must not import torch)."""

from __future__ import annotations

__all__ = ["RANDOM_LLAMA_SIZES"]

#: Shapes of the random Llamas of :func:`llm_runs.models.save_random_llama` (with the SmolLM2 vocabulary of 49,152
#: tokens, tied embeddings): ``tiny`` (about 3.2 M parameters, for tests), ``0.5b`` (about 0.48 B) and ``1b``
#: (about 1.07 B).
RANDOM_LLAMA_SIZES: dict[str, dict] = {
    "tiny": dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128),
    "0.5b": dict(hidden_size=1536, num_layers=16, num_heads=24, num_kv_heads=8, intermediate_size=4096),
    "1b": dict(hidden_size=2048, num_layers=22, num_heads=32, num_kv_heads=4, intermediate_size=5632),
}
