"""Many runs as cells of the Dask sweep engine: the seeds of a preset (:mod:`~llm_runs.sweeps.sweep`, ``python -m
llm_runs sweep``) and the positive-control gate's oracles (:mod:`~llm_runs.sweeps.gate`, ``python -m llm_runs gate``).

Imports only the layers below it.
"""
