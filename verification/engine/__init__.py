"""The engines that run checks many times: the Dask cell engine (:mod:`~verification.engine.dask_engine`), seed
sweeps (:mod:`~verification.engine.sweep`), simulation grids (:mod:`~verification.engine.grid`), the Monte Carlo
calibration (:mod:`~verification.engine.mc_calibration`) and the falsification search as Dask cells
(:mod:`~verification.engine.search_cells`).

Imports :mod:`verification.core` and the statements; nothing above it (the studies, the LLM layer, the report)."""
