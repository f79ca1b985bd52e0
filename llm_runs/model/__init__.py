"""The model: a user's model folder checked and loaded without running code from it (:mod:`~llm_runs.model.model_folder`),
the shipped SmolLM2 tokenizer without torch (:mod:`~llm_runs.model.tokenizer`), the embedded default model, random
Llamas and LoRA (:mod:`~llm_runs.model.models`), sampling with a deadline per call (:mod:`~llm_runs.model.generate`).

The lowest layer of :mod:`llm_runs`: it imports no other sub-package.
"""
