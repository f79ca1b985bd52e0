"""``prefalign``: one command for the simulation kernels, the executable statements and the LLM runs.

.. code-block:: text

    prefalign verify list|run|report|power|sweep|grid ...   (python -m verification)
    prefalign simulate ...                                  (python -m sim.simulate)
    prefalign llm ACTION ...                                (python -m llm_runs)

Each sub-command is the command line of its package, under another name: ``prefalign verify run H.9 --json
out.json`` is ``python -m verification run H.9 --json out.json``, with the same options, messages and exit status
(:mod:`prefalign.__main__`); ``prefalign --help`` lists the actions each package's parser defines. The package's
version is :data:`sim.__version__`.
"""

from sim import __version__
from sim.interrupts import quiet_if_started_as

# the command `prefalign`: a Ctrl-C from here until it handles it is one line and exit 130 (sim.interrupts)
quiet_if_started_as("prefalign", "prefalign", script="prefalign")

__all__ = ["__version__"]
