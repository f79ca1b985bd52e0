"""The theory on a real model: the records of an LLM run (:mod:`~verification.llm.records`, the only module that
knows their column names), the studies of a run (:mod:`~verification.llm.studies`), the pre-registered
personalisation statistics (:mod:`~verification.llm.personalisation`), the shots curve's pre-registered analysis
(:mod:`~verification.llm.shots`), LLM sweeps over seeds
(:mod:`~verification.llm.sweep`) and the LLM regression (:mod:`~verification.llm.regression`).

Imports :mod:`verification.core`, :mod:`verification.studies` and :mod:`verification.engine`; the dashboard's LLM
section is in :mod:`verification.report`."""
