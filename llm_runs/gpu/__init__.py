"""The Python side of the GPU check (``llm_runs/gpu_check.sh``): its preflight, speed report and fault injection
(:mod:`~llm_runs.gpu.check`, ``python -m llm_runs.gpu.check preflight|report``).

The top layer below the command line.
"""
