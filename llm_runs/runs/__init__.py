"""One LLM run (``python -m llm_runs run``): the presets and the check of a data file against one
(:mod:`~llm_runs.runs.presets`), the record files (:mod:`~llm_runs.runs.records`), the oracles' training
(:mod:`~llm_runs.runs.oracle`), Algorithm 1 on the model (:mod:`~llm_runs.runs.run`), the shots curve's evaluation
(:mod:`~llm_runs.runs.shots`), generation rewards (:mod:`~llm_runs.runs.evaluation`), the probes
(:mod:`~llm_runs.runs.probes`) and the run's figure (:mod:`~llm_runs.runs.figures`).

Imports only the layers below it.
"""
