"""Preference data: the prompt set (:mod:`~llm_runs.preferences.prompts`), the offline rewards
(:mod:`~llm_runs.preferences.rewards`), the candidate data file, its pairs and rank agreement
(:mod:`~llm_runs.preferences.data`), building it (:mod:`~llm_runs.preferences.build`), a researcher's own data
(:mod:`~llm_runs.preferences.formats`), clients with data deficiency (:mod:`~llm_runs.preferences.clients`) and the
pairs a client owns (:mod:`~llm_runs.preferences.heldout`).

Imports only :mod:`llm_runs.model` below it.
"""
