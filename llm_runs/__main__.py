"""Command line of the LLM runs.

``python -m llm_runs data build``  generate the candidate responses (resumable) and score them into the data file
``python -m llm_runs data stats``  print the objectives' within-prompt rank agreement and pair counts
``python -m llm_runs data check PATH [--columns C=COL,...] [--objectives A,B] [--preset P]``  validate a data file
    of any schema of :mod:`llm_runs.preferences.formats` (before any model is loaded) and print what a run would use
``python -m llm_runs probe conflict``  per-objective gradient cosines at the base model for synthetic clients
``python -m llm_runs probe dpo``  a short single-objective conservative-DPO run with held-out evaluation
``python -m llm_runs run --preset smoke|cpu|gpu --out DIR [--model DIR] [--device auto|cpu|cuda] [--seed N] [--gate DIR]``
    Algorithm 1 on LoRA fine-tuning of the model (:mod:`llm_runs.runs.run`): trajectory.csv, summary.json, figure.png;
    with ``--gate DIR`` the objectives are those the positive-control gate in DIR admits
    (:func:`llm_runs.sweeps.gate.admit`), checked before any work and recorded in the preset's configuration
``python -m llm_runs sweep --preset P --seeds A:B [--workers K | --scheduler ADDR] [--threads T] [--gate DIR] --out DIR``
    the seeds of a run as cells of the Dask sweep engine (:mod:`llm_runs.sweeps.sweep`): runs/<seed>/, one atomic result
    file per seed (cells/<preset>/<seed>.json), params.json, llm_sweep.json; the same command again computes only
    the seeds still missing
``python -m llm_runs random-model --size tiny|0.5b|1b --out DIR``  a randomly initialised Llama with the SmolLM2
    tokenizer, saved as a model directory (for speed checks where no weights can be brought, e.g. a GPU machine)
``python -m llm_runs.gpu.check preflight|report``  the GPU check's preflight (everything a run needs, loaded before
    any work; exit 3 naming what is missing; with ``--build SIZE --model DIR``, then the random model, in the same
    process) and speed report (``llm_runs/gpu_check.sh``)

The process re-executes itself once with ``MALLOC_MMAP_MAX_=0`` and ``MALLOC_TRIM_THRESHOLD_=100000000000`` when
they are not set (glibc malloc otherwise stalls for seconds when large tensors are freed and re-mapped), and with
``OMP_WAIT_POLICY=PASSIVE`` unless set otherwise (OpenMP threads that spin on a CPU shared with other jobs multiply
torch's CPU time).
Usage errors (a bad option, a ``--model`` directory that is missing or unusable, :mod:`llm_runs.model.model_folder`:
no code from it ever runs; an unavailable ``--device``, a data file that is missing, corrupt or too small for the
preset) exit with status 2 and one line naming the argument, before any work (the conventions of :mod:`sim.cli`).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

from sim import cli
from sim.cli import positive_float, positive_int

MALLOC_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "100000000000"}
#: OpenMP threads that wait passively: with torch's two threads on a CPU shared with other jobs, spinning threads
#: made a forward pass of SmolLM2 take 20-40 times the CPU time (2-6 s instead of 0.1-0.2 s). Kept if set.
OMP_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}
#: The sizes of ``random-model`` (the keys of :data:`llm_runs.model.models.RANDOM_LLAMA_SIZES`, written out so that the
#: parser imports no torch; a test holds them equal).
RANDOM_MODEL_SIZES = ("tiny", "0.5b", "1b")
#: The gradient layouts of ``run --layout`` (:data:`llm_runs.training.objectives.LAYOUTS`, written out so that the parser
#: imports no torch; a test holds them equal).
LAYOUTS = ("separate", "shared", "shared_loop", "sequence")
#: Fault injection for tests of the GPU check (:func:`llm_runs.gpu.check.inject_fault`): ``run`` fails at the stage
#: this variable names (``generation``: after all training). Unset in any real run.
FAULT_ENV = "PREFALIGN_INJECT_FAULT"


def _ensure_malloc_env(argv: list[str], prog: str = "python -m llm_runs") -> None:
    omp = {k: v for k, v in OMP_ENV.items() if k not in os.environ}
    if (all(os.environ.get(k) == v for k, v in MALLOC_ENV.items()) and not omp) or os.environ.get("PREFALIGN_NO_REEXEC"):
        return
    env = {**os.environ, **MALLOC_ENV, **omp, "PREFALIGN_NO_REEXEC": "1"}
    sys.stdout.flush()
    sys.stderr.flush()
    command = ["-m", "prefalign", "llm"] if prog.startswith("prefalign") else ["-m", "llm_runs"]
    os.execve(sys.executable, [sys.executable, *command, *argv], env)


def _int_list(what: str):
    """The argparse type of ``N[,N...]``: positive integers (one that is not is named as a ``what``), repeats
    dropped, in the order given."""

    def parse(text: str) -> tuple[int, ...]:
        out = []
        for part in text.split(","):
            try:
                out.append(positive_int(part.strip()))
            except argparse.ArgumentTypeError:
                raise argparse.ArgumentTypeError(f"{what} {part.strip()!r} is not an integer >= 1") from None
        return tuple(dict.fromkeys(out))

    return parse


#: ``T[,T...]``: response token limits.
_token_limits = _int_list("token limit")


def _shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected I/N (e.g. 1/2), got {text!r}") from None
    if not 1 <= i <= n:
        raise argparse.ArgumentTypeError(f"expected I/N with 1 <= I <= N, got {text!r}")
    return i - 1, n


def _add_run_options(p, default_data) -> None:
    """The options of ``run`` and ``sweep`` that choose the model, the data, the device and the preset's variant."""
    _add_model_options(p, default_data)
    _add_data_options(p)
    p.add_argument("--gate", default=None, metavar="DIR",
                   help="the positive-control gate folder (`gate --out DIR`) that admits the objectives: checked "
                        "before any work (made on this model, data file, response length and pair margin; every "
                        "objective passed it); without --objectives the objectives are those that passed (at least "
                        "the preset's minimum, 3 for the shots curve); recorded as preset_config.gate in the run's "
                        "summary.json and the sweep's params.json (default: no gate)")
    p.add_argument("--cache-dir", default=None, help="cache of the converted default model")
    _add_run_variant_options(p)


def _add_model_options(p, default_data) -> None:
    """``--model``, ``--device`` and ``--data`` (of ``run``, ``sweep`` and ``gate``)."""
    p.add_argument("--model", default=None, metavar="DIR",
                   help="a local Hugging Face causal-LM directory with safetensors weights, checked before any work; "
                        "no code from it ever runs (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: CUDA when available (default %(default)s)")
    p.add_argument("--data", default=str(default_data), metavar="PATH",
                   help="data file or folder: the shipped kind, or JSON Lines / Parquet / CSV / a saved dataset in "
                        "one of the schemas of docs/your-data.md (default: the shipped file)")


def _add_run_variant_options(p) -> None:
    p.add_argument("--quick", action="store_true",
                   help="the preset's sizes with one round of each phase and one adaptation step, and 2 evaluation "
                        "prompts x 1 sample of at most 64 tokens (a speed check)")
    p.add_argument("--shrink", action="store_true",
                   help="--quick at the smallest counts (2 preference centres with one training client each, 1 new "
                        "client, 1 pair per objective, responses cut at 16 tokens, 1 evaluation prompt) with the "
                        "preset's objectives and code paths: a CPU check of a GPU preset")
    p.add_argument("--layout", choices=LAYOUTS, default=None,
                   help="gradient layout of the m objectives (default: the device's, sequence on a CPU and "
                        "separate on a GPU)")
    p.add_argument("--autocast", choices=("bfloat16", "none", "auto"), default=None,
                   help="autocast of the training passes (default: the preset's; none: float32; auto: bf16 on a "
                        "GPU and on a CPU with native bf16 matrix instructions, float32 elsewhere)")


def _columns(text: str) -> dict[str, str]:
    """``--columns canonical=column,...``."""
    from llm_runs.preferences.formats import parse_columns

    try:
        return parse_columns(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _objectives(text: str) -> tuple[str, ...]:
    """``--objectives a,b,...``: at least two distinct names."""
    names = tuple(x.strip() for x in text.split(","))
    if any(not n for n in names):
        raise argparse.ArgumentTypeError(f"empty objective name in {text!r}")
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"objectives repeat a name: {text!r}")
    if len(names) < 2:
        raise argparse.ArgumentTypeError(f"need at least two objectives, got {text!r}")
    return names


def _add_columns_option(p) -> None:
    p.add_argument("--columns", type=_columns, default={}, metavar="CANONICAL=COLUMN,...",
                   help="the file's names of the schema's columns, e.g. prompt=question,response=answer")


def _add_data_options(p) -> None:
    _add_columns_option(p)
    p.add_argument("--objectives", type=_objectives, default=None, metavar="A,B,...",
                   help="the aspects to train on (default: the preset's for the shipped file, every aspect of "
                        "another file)")


def build_parser(prog: str = "python -m llm_runs") -> argparse.ArgumentParser:
    """The parser of this command line (``prog``: the name its messages give it, e.g. ``prefalign llm``); building
    it imports no torch."""
    from llm_runs.model.generate import GenerationSettings
    from llm_runs.preferences.data import DEFAULT_DATA_FILE
    from llm_runs.runs.presets import PRESETS
    from llm_runs.runs.probes import PROMPT_SIDES

    d = GenerationSettings()
    parser = cli.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0], epilog=cli.exit_status_help())
    sub = parser.add_subparsers(dest="command", required=True)
    data = sub.add_parser("data", help="the candidate data file: build it, or print its statistics")
    dsub = data.add_subparsers(dest="action", required=True)

    b = dsub.add_parser("build", help="generate (resumable) and score the candidates; write the data file")
    b.add_argument("--out", default=str(DEFAULT_DATA_FILE), help="data file to write (default: the shipped file)")
    b.add_argument("--work", default="runs/data-build",
                   help="directory of the resumable generation file (default: runs/data-build)")
    b.add_argument("--prompts", type=positive_int, default=None, help="use the first N prompts (default: all)")
    b.add_argument("--responses", type=positive_int, default=d.responses_per_prompt, help="responses per prompt")
    b.add_argument("--max-new-tokens", type=positive_int, default=d.max_new_tokens)
    b.add_argument("--temperature", type=positive_float, default=d.temperature)
    b.add_argument("--top-p", type=positive_float, default=d.top_p)
    b.add_argument("--seed", type=int, default=d.seed)
    b.add_argument("--timeout", type=positive_float, default=d.timeout_s,
                   help="wall-clock limit of one generate call in seconds; its responses are then marked cut off")
    b.add_argument("--prompts-per-call", type=positive_int, default=d.prompts_per_call)
    b.add_argument("--threads", type=positive_int, default=1, help="torch threads (default 1)")
    b.add_argument("--shard", type=_shard, default=(0, 1), metavar="I/N",
                   help="generate only call groups g with g %% N == I-1 (run N processes with I = 1..N, one "
                        "thread each); scoring and the data file are left to a run without --shard")
    b.add_argument("--model", default=None, help="a local Hugging Face causal-LM directory (default: SmolLM2); no "
                                                  "code from it ever runs")
    b.add_argument("--cache-dir", default=None, help="cache of the converted default model")
    b.add_argument("--reverse", action="store_true",
                   help="take the call groups last first (a second process on the same work meets the first)")
    b.add_argument("--keep-timeouts", action="store_true",
                   help="do not sample again the prompts whose responses a call deadline cut off")
    b.add_argument("--score-only", action="store_true",
                   help="generate nothing: score the prompts already generated in --work and write the data file")
    b.add_argument("--no-progress", action="store_true", help="no progress bar")

    s = dsub.add_parser("stats", help="print the within-prompt rank agreement of the objectives and pair counts, on "
                                      "the full texts and on the texts the presets train on")
    s.add_argument("--data", default=str(DEFAULT_DATA_FILE),
                   help="data file (default: the shipped file; any schema of docs/your-data.md)")
    s.add_argument("--json", action="store_true", help="print the statistics as JSON")
    s.add_argument("--tokens", type=_token_limits, default=None, metavar="T[,T...]",
                   help="response token limits of the trained texts (default: every preset's max_response_tokens)")
    s.add_argument("--objectives", default=None,
                   help="comma-separated objective names (default: every reward of the data file for the full texts, "
                        "the presets' objectives for the trained texts)")
    s.add_argument("--model", default=None, metavar="DIR",
                   help="the tokenizer of this Hugging Face model directory, checked as a run checks it (no "
                         "code from it ever runs; default: SmolLM2's, shipped)")
    s.add_argument("--prompts", choices=PROMPT_SIDES, default="all",
                   help="the prompts measured: the calibration or the study side of the data file's calibration "
                        "split, or all (default %(default)s); the pair margin's sd is pooled over these prompts")
    rs = dsub.add_parser("rescore", help="score every response of a data file again with the current rewards")
    rs.add_argument("--data", default=str(DEFAULT_DATA_FILE), help="data file (default: the shipped file)")
    rs.add_argument("--out", default=None, help="data file to write (default: the --data file)")
    rs.add_argument("--no-progress", action="store_true", help="no progress bar")
    rs.add_argument("--all", action="store_true",
                    help="score every reward again (default: only rewards that the file lacks or holds at another "
                         "version; the others keep their scores bit for bit)")
    ck = dsub.add_parser("check", help="validate a data file of any schema (before any model is loaded) and print "
                                       "what a run would use: prompts, responses, pairs per objective after "
                                       "truncation, rank agreement, correlation with length")
    ck.add_argument("path", metavar="PATH", help="data file or folder (docs/your-data.md)")
    _add_data_options(ck)
    ck.add_argument("--preset", choices=sorted(PRESETS), default="smoke",
                    help="the run preset whose response limit, margin and clients are checked (default %(default)s)")
    ck.add_argument("--model", default=None, metavar="DIR",
                    help="the tokenizer of this Hugging Face model directory, checked as a run checks it (no "
                         "code from it ever runs; default: SmolLM2's, shipped)")
    size = ck.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="the preset's --quick variant (as run --quick)")
    size.add_argument("--shrink", action="store_true", help="the preset's --shrink variant (as run --shrink)")
    ck.add_argument("--seed", type=cli.seed, default=0, help="the seed whose clients are dealt (default 0)")
    ck.add_argument("--json", action="store_true", help="print the statistics as JSON")
    pr = sub.add_parser("probe", help="measurements on the data file with the default model")
    psub = pr.add_subparsers(dest="action", required=True)
    common = cli.ArgumentParser(add_help=False)
    common.add_argument("--data", default=str(DEFAULT_DATA_FILE), help="data file (default: the shipped file)")
    common.add_argument("--objectives", default=None,
                        help="comma-separated objective names (default: every reward in the data file)")
    common.add_argument("--model", default=None,
                        help="a local Hugging Face causal-LM directory (default: SmolLM2); no code from it ever runs")
    common.add_argument("--cache-dir", default=None, help="cache of the converted default model")
    common.add_argument("--seed", type=int, default=0)
    common.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's)")
    common.add_argument("--beta", type=positive_float, default=1.0, help="DPO beta")
    common.add_argument("--label-smoothing", type=float, default=0.1, help="DPO label smoothing eps (floor H(eps))")
    common.add_argument("--max-response-tokens", type=positive_int, default=256)
    common.add_argument("--json", default=None, help="also write the results to this JSON file")
    common.add_argument("--prompts", choices=PROMPT_SIDES, default="all",
                        help="the prompts whose pairs the probe uses: the calibration or the study side of the data "
                             "file's calibration split (objectives are chosen on the calibration side), or all "
                             "(default %(default)s)")
    c = psub.add_parser("conflict", parents=[common],
                        help="per-objective gradient cosines at the base model for synthetic clients")
    c.add_argument("--clients", type=positive_int, default=3)
    c.add_argument("--prompts-per-client", type=positive_int, default=2)
    c.add_argument("--pairs", type=positive_int, default=4, help="pairs per objective and client")
    c.add_argument("--layout", default=None, help="separate | shared | shared_loop (default: the library's)")
    dp = psub.add_parser("dpo", parents=[common], help="a short single-objective conservative-DPO run")
    dp.add_argument("--objective", required=True)
    dp.add_argument("--pairs", type=positive_int, default=8, help="training pairs")
    dp.add_argument("--heldout-pairs", type=positive_int, default=8, help="held-out pairs per objective")
    dp.add_argument("--steps", type=positive_int, default=20)
    dp.add_argument("--lr", type=positive_float, default=5e-4)
    dp.add_argument("--eval-every", type=positive_int, default=5)

    r = sub.add_parser("run", help="Algorithm 1 on LoRA fine-tuning of the model (trajectory.csv, summary.json)")
    r.add_argument("--preset", choices=sorted(PRESETS), default="smoke",
                   help="smoke: minutes on 2 CPU cores; cpu: a small study, tens of minutes; gpu: sized for a GPU "
                        "(default %(default)s)")
    r.add_argument("--out", required=True, help="output directory (created if missing)")
    r.add_argument("--seed", type=cli.seed, default=0, help="RNG seed, an integer >= 0 (default %(default)s)")
    r.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's)")
    _add_run_options(r, DEFAULT_DATA_FILE)
    r.add_argument("--no-progress", action="store_true", help="no progress bar")

    sw = sub.add_parser("sweep", help="seeds of a run preset as cells of the Dask sweep engine: one run directory "
                                      "and one atomic result file per seed, resumable, a summary (llm_sweep.json)",
                        epilog=cli.exit_status_help("a cell failed (its run raised, or its worker died more often "
                                                    "than the scheduler allows) or a run is not complete"))
    sw.add_argument("--preset", choices=sorted(PRESETS), required=True, help="the run preset of every seed")
    sw.add_argument("--seeds", type=cli.seed_range, required=True, metavar="A:B",
                    help="the seeds A, A+1, ..., B-1 (integers 0 <= A < B), one cell each")
    _add_cluster_options(sw, "seed", "run")
    _add_run_options(sw, DEFAULT_DATA_FILE)
    sw.add_argument("--out", required=True, metavar="DIR",
                    help="the sweep folder: runs/<seed>/, cells/<preset>/<seed>.json, params.json, llm_sweep.json")
    sw.add_argument("--quiet", action="store_true", help="no progress bar")

    _add_gate_parser(sub, DEFAULT_DATA_FILE)

    rm = sub.add_parser("random-model", help="save a randomly initialised Llama with the SmolLM2 tokenizer")
    rm.add_argument("--size", choices=RANDOM_MODEL_SIZES, default="0.5b",
                    help="tiny: about 3.2 M parameters; 0.5b: about 0.48 B; 1b: about 1.07 B (default %(default)s)")
    rm.add_argument("--out", required=True, help="model directory to write")
    rm.add_argument("--seed", type=cli.seed, default=0)
    rm.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                    help="dtype of the saved weights (default %(default)s, the dtype a run loads and times them "
                         "in; bfloat16 halves the file, and a run upcasts it to float32)")
    return parser


def _add_cluster_options(p, unit: str, what: str) -> None:
    """``--workers K | --scheduler ADDRESS``, ``--connect-timeout`` and ``--threads`` of the commands whose cells run
    on the Dask engine (``sweep``, ``gate``): one ``unit`` per worker at a time, each ``what`` with T torch threads."""
    where = p.add_mutually_exclusive_group()
    where.add_argument("--workers", type=positive_int, metavar="K",
                       help=f"start a local Dask cluster of K worker processes, one {unit} at a time each (default: "
                            "CPUs // --threads; 1 with --device cuda)")
    where.add_argument("--scheduler", metavar="ADDRESS",
                       help="use the existing Dask cluster whose scheduler listens at ADDRESS (e.g. "
                            "tcp://10.0.0.5:8786); one GPU per worker for --device cuda. Dask sends it pickled tasks "
                            "and unpickles the results it sends back: trust the cluster, and everyone who can reach "
                            "its scheduler, as much as your own account")
    p.add_argument("--connect-timeout", type=positive_float, default=5.0, metavar="S",
                   help="seconds allowed to reach the --scheduler (default %(default)s)")
    p.add_argument("--threads", type=positive_int, default=1, metavar="T",
                   help=f"torch threads of each {what} (default %(default)s)")


def _add_gate_parser(sub, default_data) -> None:
    """``gate``: its defaults are :class:`~llm_runs.sweeps.gate.GateSettings`' (the study's where it takes them,
    :meth:`~llm_runs.sweeps.gate.GateSettings.from_study`) and the module's budgets and draws: one source."""
    from llm_runs.runs.presets import OBJECTIVES_3
    from llm_runs.sweeps.gate import DEFAULT_BUDGETS, DEFAULT_DRAWS, GateSettings

    d = GateSettings.from_study(OBJECTIVES_3)
    g = sub.add_parser("gate", help="the positive-control gate: oracles trained at a target preference on each "
                                    "candidate objective, scored on held-out calibration prompts (cells of the Dask "
                                    "sweep engine, gate.json)",
                       epilog=cli.exit_status_help("a cell failed (it raised, or its worker died more often than "
                                                   "the scheduler allows) or is missing"))
    g.add_argument("--objectives", type=_objectives, default=d.objectives, metavar="A,B,...",
                   help="the candidate objectives, rewards of the data file (default: the study's, "
                        f"{','.join(d.objectives)})")
    g.add_argument("--budgets", type=_int_list("budget"), default=DEFAULT_BUDGETS, metavar="B[,B...]",
                   help="training pairs per objective of an oracle, one set of cells each (default "
                        f"{','.join(map(str, DEFAULT_BUDGETS))})")
    g.add_argument("--draws", type=positive_int, default=DEFAULT_DRAWS, metavar="N",
                   help="draws 0..N-1 of the held-out split and training pairs, one cell each (default %(default)s)")
    g.add_argument("--target", type=float, default=d.target,
                   help="the oracle's preference on its objective, in (1/m, 1); the rest spread evenly "
                        "(default %(default)s)")
    g.add_argument("--steps", type=positive_int, default=d.steps, help="full-batch AdamW steps (default %(default)s)")
    g.add_argument("--lr", type=positive_float, default=d.lr, help="AdamW learning rate (default %(default)s)")
    g.add_argument("--max-response-tokens", type=positive_int, default=d.max_response_tokens, metavar="T",
                   help="responses cut at T tokens, the text trained on and scored (default: the study's, "
                        "%(default)s)")
    g.add_argument("--heldout-prompts", type=positive_int, default=d.heldout_prompts, metavar="N",
                   help="at least N calibration prompts held out per draw (default %(default)s)")
    g.add_argument("--heldout-pairs", type=positive_int, default=d.heldout_pairs, metavar="N",
                   help="held-out pairs per objective and draw (default %(default)s)")
    g.add_argument("--max-pairs", type=positive_int, default=d.max_pairs, metavar="N",
                   help="a training step's pairs go forward and backward in chunks of at most N (all objectives "
                        "together), their gradients summed: memory for one chunk's activations (default %(default)s)")
    _add_cluster_options(g, "cell", "cell")
    _add_model_options(g, default_data)
    _add_columns_option(g)
    g.add_argument("--cache-dir", default=None, help="cache of the converted default model")
    g.add_argument("--out", required=True, metavar="DIR",
                   help="the gate folder: cells/<objective>/b<budget>-d<draw>.json, params.json, gate.json")
    g.add_argument("--quiet", action="store_true", help="no progress bar")


def _preset_of(args):
    """The preset of ``run`` or ``sweep``: ``--preset`` with its ``--shrink`` / ``--quick`` / ``--autocast`` variant."""
    from llm_runs.runs.presets import PRESETS

    preset = PRESETS[args.preset]
    if args.shrink:
        preset = preset.shrunk()
    elif args.quick:
        preset = preset.quick()
    if args.autocast is not None:
        from dataclasses import replace

        from llm_runs.runs.presets import resolve_autocast

        preset = replace(preset, autocast=resolve_autocast(args.autocast, args.device))
    return _with_objectives(preset, args, getattr(args, "data", None))


def _with_objectives(preset, args, data):
    """``preset`` with the objectives of ``--objectives`` (at least :attr:`~llm_runs.runs.presets.RunPreset.min_objectives`),
    or of the data file when it is not the shipped kind and none are given (every aspect it has); a data file that
    cannot be read is a usage error. With ``--gate DIR`` the gate admits them (:func:`llm_runs.sweeps.gate.admit`:
    without ``--objectives``, those that passed it) and the preset records it (``gate``); a refusal is a usage
    error naming the gate."""
    from dataclasses import replace

    from llm_runs.preferences.data import DataFileError
    from llm_runs.preferences.formats import is_candidates_file, load_data

    objectives = args.objectives
    if objectives is not None and len(objectives) < preset.min_objectives:
        raise cli.UsageError(f"argument --objectives: preset {preset.name} needs at least {preset.min_objectives} "
                             f"objectives; got {','.join(objectives)!r}")
    if getattr(args, "gate", None) is not None:
        from llm_runs.runs.presets import GateAdmission
        from llm_runs.sweeps.gate import GateRefusal, admit

        try:
            objectives, gate = admit(args.gate, objectives=objectives, min_objectives=preset.min_objectives,
                                     model_dir=args.model, max_response_tokens=preset.max_response_tokens,
                                     margin=preset.design.margin, data=data, columns=args.columns)
        except GateRefusal as exc:
            raise cli.UsageError(f"argument --gate: {exc}") from None
        except OSError as exc:
            raise cli.UsageError(f"argument --data: cannot read data file {str(data)!r}: {exc}") from None
        except ValueError as exc:  # a DataFileError: a saved dataset that names a file outside its folder
            raise cli.UsageError(f"argument --data: {exc}") from None
        return replace(preset, design=replace(preset.design, objectives=objectives), gate=GateAdmission(**gate))
    try:
        if objectives is None and not is_candidates_file(data):
            objectives = load_data(data, columns=args.columns).objectives
            if len(objectives) < 2:
                raise DataFileError(f"data file {data}: it has one objective ({objectives[0]}); a run needs two")
    except DataFileError as exc:
        raise cli.UsageError(f"argument --data: {exc}") from None
    if objectives is None:
        return preset
    return replace(preset, design=replace(preset.design, objectives=tuple(objectives)))


def _check_sweep_args(args):
    """Usage checks of ``sweep`` before any work: when a seed is left to run (its cell file is not in the folder),
    the checks of ``run`` at the first such seed (model directory, CUDA for a local cluster, data file, objectives
    and clients), then the folder (writable, made with these parameters, its cell files results of this preset):
    every argument is checked before the folder is created or the data hashed. Returns the preset and the folder's
    parameters."""
    from argparse import Namespace

    from llm_runs.sweeps.sweep import check_folder, pending_seeds

    _tokenizer(args.model)  # the --model directory before any work
    preset = _preset_of(args)
    pending = pending_seeds(args, preset)
    if pending:  # with --scheduler, CUDA is the workers' to have: the runs check it
        device = "auto" if args.scheduler and args.device == "cuda" else args.device
        _check_run_args(Namespace(**{**vars(args), "seed": pending[0], "device": device}))
    params, _ = check_folder(args, preset)
    return preset, params


def _check_gate_args(args):
    """Usage checks of ``gate`` before any work: the model directory, CUDA for a local cluster, the settings (the
    target against the number of objectives), the data file and its objectives, whether every draw's calibration
    prompts hold the held-out pairs and the largest budget, then the folder (writable, made with these parameters,
    its cell files results of their coordinates). Returns the settings, the folder's parameters and the calibration
    prompt ids."""
    from llm_runs.preferences.data import DataFileError, UnknownObjectiveError
    from llm_runs.sweeps.gate import (
        GateDataError,
        GateSettings,
        GateSettingsError,
        draw_split,
        gate_candidates,
        gate_params,
        read_cells,
    )
    from verification.engine.dask_engine import CellFolderError, check_params

    tokenizer = _tokenizer(args.model)
    _check_device(args.device if not args.scheduler else "auto")
    try:
        settings = GateSettings.from_study(args.objectives, target=args.target, steps=args.steps, lr=args.lr,
                                           max_response_tokens=args.max_response_tokens,
                                           heldout_prompts=args.heldout_prompts, heldout_pairs=args.heldout_pairs,
                                           max_pairs=args.max_pairs)
    except GateSettingsError as exc:
        raise cli.UsageError(f"argument --{exc.field.replace('_', '-')}: {exc}") from None
    try:
        cands, calibration = gate_candidates(settings, tokenizer, args.data, args.columns, model_dir=args.model)
    except UnknownObjectiveError as exc:
        raise cli.UsageError(f"argument --objectives: {exc}") from None
    except DataFileError as exc:
        raise cli.UsageError(f"argument --data: {exc}") from None
    for d in range(args.draws):
        try:
            split = draw_split(cands, settings, calibration, d)
        except GateDataError as exc:
            raise cli.UsageError(f"argument --heldout-pairs: {exc}") from None
        try:
            split.train_batches(max(args.budgets))
        except GateDataError as exc:
            raise cli.UsageError(f"argument --budgets: {exc}") from None
    out = cli.check_writable_dir(args.out, "--out")
    try:
        params = gate_params(settings, model_dir=args.model, data=args.data, device=args.device,
                             threads=args.threads, columns=args.columns)
    except OSError as exc:
        raise cli.UsageError(f"argument --data: cannot read data file {str(args.data)!r}: {exc}") from None
    try:
        check_params(out, params)
        read_cells(out, settings, args.budgets, args.draws)
    except CellFolderError as exc:
        raise cli.UsageError(f"argument --out: {exc}") from None
    return settings, params, calibration


def _gate_note(preset) -> None:
    """One line on stderr naming the gate that admitted the objectives of a ``--gate`` run."""
    if preset.gate is not None:
        print(f"objectives {', '.join(preset.design.objectives)} admitted by the gate {preset.gate.path} (gate.json "
              f"sha256 {preset.gate.sha256[:12]}; passed: {', '.join(preset.gate.passed)})", file=sys.stderr,
              flush=True)


def _check_device(device: str) -> None:
    """``--device cuda`` on a machine without CUDA is a usage error."""
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise cli.UsageError("argument --device: 'cuda' requested but CUDA is not available on this machine "
                                 "(use --device cpu or auto)")


def _check_run_args(args):
    """Usage checks of ``run`` before any work: the model directory (:func:`_tokenizer`), the device, the data file
    and whether it holds enough prompts for the preset, then the output directory (created only then). Returns the
    preset."""
    import numpy as np

    from llm_runs.preferences.clients import DataShortageError
    from llm_runs.preferences.data import DataFileError, UnknownObjectiveError
    from llm_runs.runs.presets import federation, training_candidates

    tokenizer = _tokenizer(args.model)  # the --model directory first (llm_runs.model.model_folder)
    _check_device(args.device)
    preset = _preset_of(args)
    try:
        # pairs exist only on the trained text: the responses cut at the preset's token limit by the run's tokenizer
        _, cands = training_candidates(preset, tokenizer, args.data, args.columns)
        federation(preset, cands, np.random.default_rng(args.seed))
    except (DataFileError, DataShortageError, UnknownObjectiveError) as exc:
        raise cli.UsageError(f"argument --data: {exc}") from None
    cli.check_writable_dir(args.out, "--out")  # created only once every other argument is checked
    return preset


def _run(args, preset, argv=None) -> int:
    from llm_runs.runs.run import run

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if os.environ.get(FAULT_ENV):  # a test of the GPU check's report of a failed run (llm_runs.gpu.check)
        from llm_runs.gpu.check import inject_fault

        inject_fault(os.environ[FAULT_ENV])
    s = run(preset, args.out, model_dir=args.model, device=args.device, seed=args.seed, data=args.data,
            cache_dir=args.cache_dir, progress=not args.no_progress, layout=args.layout, columns=args.columns,
            argv=argv)
    print(_run_screen(s, args.out))
    return 0


def _run_screen(s: dict, out) -> str:
    t = s["timing"]
    lines = [f"LLM run, preset {s['preset']} (seed {s['seed']}), {s['model']['name']} on {s['model']['device']}: "
             f"{s['seconds']:.0f} s wall, {s['cpu_seconds']:.0f} s CPU; {s['gradient_evaluations']['done']} client "
             f"gradient evaluations ({t['gradient_evaluations_per_second']:.3g}/s, {t['tokens_per_second']:.3g} "
             f"tokens/s); peak RSS {s['memory']['peak_rss_bytes'] / 2**30:.2f} GiB"]
    if "cuda_peak_allocated_bytes" in s["memory"]:
        lines[-1] += f", peak CUDA memory {s['memory']['cuda_peak_allocated_bytes'] / 2**30:.2f} GiB"
    lines.append(f"  objectives {', '.join(s['objectives'])}; gradient cosines at the base model (mean over clients): "
                 + ", ".join(f"{p['a']}/{p['b']} {p['mean']:+.2f}" for p in s["gradient_conflict_at_base_model"]["pairs"]))
    lines.append("  minimum loss over the run (floor H(eps) = {:.4f}): ".format(next(iter(s["min_loss"].values()))["floor"])
                 + ", ".join(f"{o} {v['min_any_loss']:.4f}" for o, v in s["min_loss"].items()))
    lines.append(f"  LP step statuses: {s['lp_step_status_counts']}")
    if s.get("new_clients"):
        lines.append(f"  new clients, mean r_hat = psi - psi_hat* after K = {s['pipeline1_vs_pipeline2_at_K']['K']} "
                     "steps (r_hat under-estimates r):")
        for k, v in s["algorithm"]["mean_final_gap"].items():
            lines.append(f"    {k:<24s} {v:.4g}")
    lines.append(f"  wrote {out}/trajectory.csv, summary.json, figure.png")
    return "\n".join(lines)


def _random_model(args) -> int:
    from llm_runs.gpu.check import save_random_model

    return save_random_model(args.out, args.size, seed=args.seed, dtype=args.dtype)


def _probe_model(args):
    import torch

    from llm_runs.model.models import add_lora, load_model
    from llm_runs.preferences.data import load_candidates, trained_candidates
    from llm_runs.runs.probes import select_prompts
    from llm_runs.training.objectives import DPOSettings, PreferenceModel

    if args.model is not None:
        _tokenizer(args.model)  # the --model directory before any work
    settings = DPOSettings(beta=args.beta, label_smoothing=args.label_smoothing,
                           max_response_tokens=args.max_response_tokens)
    cands = load_candidates(args.data)
    objectives = cands.check_objectives(args.objectives.split(",") if args.objectives else cands.objectives)
    have = len(select_prompts(cands, args.prompts).prompt_ids)
    need = args.clients * args.prompts_per_client if args.action == "conflict" else 2
    if need > have:  # before the model loads
        raise cli.UsageError(f"--prompts {args.prompts}: the data file has {have} such prompts; the probe needs "
                             f"{need}" + (f" (--clients {args.clients} x --prompts-per-client "
                                          f"{args.prompts_per_client})" if args.action == "conflict" else ""))
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = load_model(args.model, cache_dir=args.cache_dir)
    # the labels score the text the model trains on (its first --max-response-tokens tokens), as a run's labels do
    cands = select_prompts(trained_candidates(cands, tok, args.max_response_tokens, objectives), args.prompts)
    return cands, objectives, PreferenceModel(add_lora(model), tok, settings)


def _write_json(path, obj) -> None:
    import json

    if path:
        with open(path, "w") as f:
            json.dump(obj, f, indent=1)


def _probe_conflict(args) -> int:
    import numpy as np

    from llm_runs.runs.probes import gradient_conflict, synthetic_clients

    cands, objectives, pm = _probe_model(args)
    clients = synthetic_clients(cands, objectives, n_clients=args.clients, prompts_per_client=args.prompts_per_client,
                                pairs_per_objective=args.pairs, rng=np.random.default_rng(args.seed))

    def show(r):
        print(f"client {r['client']}: losses {np.round(r['losses'], 4).tolist()}  |g| "
              f"{np.format_float_scientific(min(r['grad_norms']), 2)}..{np.format_float_scientific(max(r['grad_norms']), 2)}"
              f"  ({r['seconds']:.0f} s)", flush=True)

    res = gradient_conflict(pm, clients, layout=args.layout, progress=show)
    cos = np.array([r["cosine"] for r in res])
    print(f"\ngradient cosines at the base model (LoRA init), {len(res)} clients, objectives {list(objectives)}")
    print(f"{'objective a':<16} {'objective b':<16} {'mean':>7} {'min':>7} {'max':>7}  per client")
    rows = []
    for a in range(len(objectives)):
        for b in range(a + 1, len(objectives)):
            v = cos[:, a, b]
            rows.append({"a": objectives[a], "b": objectives[b], "mean": float(v.mean()), "min": float(v.min()),
                         "max": float(v.max()), "per_client": v.tolist()})
            print(f"{objectives[a]:<16} {objectives[b]:<16} {v.mean():>7.3f} {v.min():>7.3f} {v.max():>7.3f}  "
                  f"{np.round(v, 3).tolist()}")
    _write_json(args.json, {"clients": res, "pairs": rows, "settings": vars(args)})
    return 0


def _probe_dpo(args) -> int:
    import numpy as np

    from llm_runs.preferences.data import preference_pairs
    from llm_runs.runs.probes import dpo_probe

    cands, objectives, pm = _probe_model(args)
    cands.scores_of(args.objective)
    rng = np.random.default_rng(args.seed)
    ids = list(cands.prompt_ids)
    order = rng.permutation(len(ids))
    half = len(ids) // 2
    train_ids, held_ids = [ids[k] for k in order[:half]], [ids[k] for k in order[half:]]

    def pick(o, pool, n):
        pairs = preference_pairs(cands, o, prompt_ids=pool)
        take = rng.choice(len(pairs), size=min(n, len(pairs)), replace=False)
        return [pairs[k] for k in sorted(take)]

    train = pick(args.objective, train_ids, args.pairs)
    heldout = {o: pick(o, held_ids, args.heldout_pairs) for o in objectives}

    def show(h):
        extra = ""
        if h.get("heldout"):
            extra = "  held-out " + " ".join(f"{o}={v['loss']:.3f}/{v['accuracy']:.2f}" for o, v in h["heldout"].items())
        print(f"step {h['step']:>3}: train {h['train_loss']:.4f} ({h['seconds']:.0f} s){extra}", flush=True)

    res = dpo_probe(pm, train, heldout, steps=args.steps, lr=args.lr, objective=args.objective,
                    eval_every=args.eval_every, progress=show)
    last = res["history"][-1]
    print(f"final: train {last['train_loss']:.4f}; minimum training loss {res['min_train_loss']:.4f} "
          f"(floor H(eps) = {res['floor']:.4f})")
    print("held-out loss/accuracy at the end: " + " ".join(
        f"{o}={v['loss']:.3f}/{v['accuracy']:.2f}" for o, v in last["heldout"].items()))
    _write_json(args.json, {**res, "settings": vars(args)})
    return 0


def _data_build(args) -> int:
    import torch

    from llm_runs.model.generate import GenerationSettings
    from llm_runs.model.models import load_model
    from llm_runs.preferences.build import (
        GenerationFileError,
        generation_header,
        model_identity,
        read_work,
        run_generation,
        seed_from_data_file,
    )
    from llm_runs.preferences.prompts import prompt_set

    settings = GenerationSettings(
        responses_per_prompt=args.responses,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        timeout_s=args.timeout,
        prompts_per_call=args.prompts_per_call,
    )
    if args.model is not None:
        _tokenizer(args.model)  # the --model directory before any work
    torch.set_num_threads(args.threads)
    prompts = prompt_set(args.prompts)
    info = model_identity(args.model)
    taken = seed_from_data_file(args.out, args.work, info, settings)
    if taken:
        print(f"{taken} prompts of {args.out} count as done (same model and settings)", file=sys.stderr)
    elif os.path.exists(args.out):
        print(f"note: {args.out} was made with other settings or another model; it will be replaced",
              file=sys.stderr)

    def loader():
        print(f"loading the model ({args.model or 'default'}) ...", file=sys.stderr, flush=True)
        return load_model(args.model, cache_dir=args.cache_dir)

    if args.score_only:
        order = {pid: i for i, (pid, _) in enumerate(prompts)}
        records = sorted((r for r in read_work(args.work, generation_header(info, settings)) if r["id"] in order),
                         key=lambda r: order[r["id"]])
        if not records:
            raise GenerationFileError(f"--score-only: no generated prompts in {args.work}")
    else:
        records = run_generation(None, None, prompts, settings, args.work, info, shard=args.shard,
                                 reverse=args.reverse, retry_timeouts=not args.keep_timeouts,
                                 progress=not args.no_progress, loader=loader)
    if args.shard[1] > 1 or args.reverse:
        print(f"shard {args.shard[0] + 1}/{args.shard[1]} done; {len(records)} prompts generated in {args.work}")
        return 0
    from llm_runs.preferences.data import score_and_write

    path = score_and_write(records, settings, info, args.out, progress=not args.no_progress,
                           prompt_target=len(prompts))
    print(f"wrote {path} ({os.path.getsize(path)} bytes, {len(records)} of {len(prompts)} prompts)")
    return 0


def _data_stats(args) -> int:
    import json

    from llm_runs.preferences.data import agreement_table, trained_candidates, truncation_table
    from llm_runs.preferences.formats import load_data
    from llm_runs.runs.presets import PRESETS
    from llm_runs.runs.probes import select_prompts

    cands = load_data(args.data)  # the shipped kind, or a file of any schema (llm_runs.preferences.formats)
    side = select_prompts(cands, args.prompts)
    if args.objectives:
        objectives = cands.check_objectives(args.objectives.split(","))
        trained_objectives = objectives
    else:  # the full texts: every reward of the file; the trained texts: the objectives the presets train on
        objectives = cands.objectives
        preset_objectives = {o for p in PRESETS.values() for o in p.design.objectives}
        trained_objectives = tuple(o for o in cands.objectives if o in preset_objectives) or objectives
    tokens = args.tokens or tuple(sorted({p.max_response_tokens for p in PRESETS.values()}))
    stats = {"full_text": agreement_table(side, objectives)}
    try:
        tok = _tokenizer(args.model)
    except ModuleNotFoundError as exc:  # without the llm extra: the full texts only, and say why
        print(json.dumps(stats, indent=1) if args.json else stats["full_text"]["text"])
        print(f"python -m llm_runs data stats: the trained-text tables need the llm extra ({exc.name} is missing: "
              f"pip install 'prefalign-verify[llm]')", file=sys.stderr)
        return 0
    stats["trained_text"] = {
        str(T): agreement_table(select_prompts(trained_candidates(cands, tok, T, trained_objectives), args.prompts),
                                trained_objectives) for T in tokens}
    stats["truncation"] = truncation_table(side, tok, tokens, trained_objectives)
    if args.json:
        print(json.dumps(stats, indent=1))
    else:
        print("\n\n".join([stats["full_text"]["text"], *(v["text"] for v in stats["trained_text"].values()),
                            stats["truncation"]["text"]]))
    return 0


def _data_check(args, prog: str) -> int:
    """``data check PATH``: :func:`llm_runs.runs.presets.data_check`; a fault is a usage error (exit 2, one line)."""
    from llm_runs.preferences.data import DataFileError
    from llm_runs.runs.presets import PRESETS, data_check

    preset = PRESETS[args.preset]
    preset = preset.shrunk() if args.shrink else preset.quick() if args.quick else preset
    try:
        tokenizer = _tokenizer(args.model)  # the --model directory before the data
        report = data_check(args.path, columns=args.columns, objectives=args.objectives, preset=preset,
                            tokenizer=tokenizer, seed=args.seed)
    except (DataFileError, cli.UsageError) as exc:
        return cli.print_usage_error(cli.UsageError(str(exc)), prog)
    if args.json:
        import json

        print(json.dumps({k: v for k, v in report.items() if k != "text"}, indent=1, default=str))
    else:
        print(report["text"])
    return 0


@functools.cache
def _tokenizer(model_dir):
    """The tokenizer of a ``--model`` directory, or SmolLM2's (shipped with the package; imports no torch). The
    directory is checked first (:func:`llm_runs.model.model_folder.check_model_folder`: no code from it runs, pickled or
    ill-fitting weights and a broken tokenizer are refused); a fault is a :class:`cli.UsageError` naming it. Once
    per directory and process (the command's checks and its work share it)."""
    from llm_runs.model.tokenizer import smollm2_tokenizer

    if model_dir is None:
        return smollm2_tokenizer()
    from llm_runs.model.model_folder import ModelFolderError, ModelNotFoundError, check_model_folder

    try:
        return check_model_folder(model_dir)
    except (ModelFolderError, ModelNotFoundError) as exc:
        raise cli.UsageError(f"argument --model: {exc}") from None


def _data_rescore(args) -> int:
    from llm_runs.preferences.data import rescore_file

    path = rescore_file(args.data, args.out, progress=not args.no_progress, keep_current=not args.all)
    print(f"wrote {path}")
    return 0


def _input_errors() -> tuple[type[Exception], ...]:
    from llm_runs.model.model_folder import ModelFolderError, ModelNotFoundError
    from llm_runs.preferences.build import GenerationFileError
    from llm_runs.preferences.data import DataFileError
    from llm_runs.preferences.rewards import UnknownObjectiveError

    return (DataFileError, GenerationFileError, ModelFolderError, ModelNotFoundError, UnknownObjectiveError)


def main(argv: list[str] | None = None, prog: str = "python -m llm_runs") -> int:
    """Run the command line on ``argv`` (default ``sys.argv[1:]``); returns the exit status (0; 2 on a usage error
    or a bad input file, model directory or objective name; 130 when interrupted, at any point: one line)."""
    with cli.interrupts_recorded():
        try:
            return cli.exit_status(_main(list(sys.argv[1:] if argv is None else argv), prog), prog)
        except ImportError:
            if not cli.interrupt_pending():
                raise
            print(f"{prog}: interrupted", file=sys.stderr, flush=True)  # a Ctrl-C inside a C extension's import
            return cli.EXIT_INTERRUPTED
        except KeyboardInterrupt:  # while the parser is built or the arguments checked (the data read)
            print(f"{prog}: interrupted", file=sys.stderr, flush=True)
            return cli.EXIT_INTERRUPTED


def _main(argv: list[str], prog: str) -> int:
    parser = build_parser(prog)
    try:
        args = parser.parse_args(argv)  # usage errors exit 2 here, before any work
        preset = _check_run_args(args) if args.command == "run" else None
        swept = _check_sweep_args(args) if args.command == "sweep" else None
        gated = _check_gate_args(args) if args.command == "gate" else None
    except cli.UsageError as exc:
        return cli.print_usage_error(exc, prog)
    # a Ctrl-C swallowed while the checks imported their modules: stop before the work (and before the malloc
    # re-exec of _ensure_malloc_env, whose new process image would lose it)
    cli.raise_if_interrupted()
    try:
        if args.command == "run":
            _ensure_malloc_env(argv, prog)
            _gate_note(preset)
            return _run(args, preset, argv)
        if args.command == "sweep":
            _ensure_malloc_env(argv, prog)  # the workers of a local cluster inherit the malloc and OpenMP settings
            from llm_runs.sweeps.sweep import command

            assert swept is not None
            _gate_note(swept[0])
            return command(args, swept[0], swept[1], prog=prog)
        if args.command == "gate":
            _ensure_malloc_env(argv, prog)  # the workers of a local cluster inherit the malloc and OpenMP settings
            from llm_runs.sweeps.gate import command as gate_command

            assert gated is not None
            settings, params, calibration = gated
            return gate_command(args, settings, params, calibration, prog=prog)
        if args.command == "random-model":
            return _random_model(args)
        if args.command == "data" and args.action == "build":
            _ensure_malloc_env(argv, prog)
            return _data_build(args)
        if args.command == "data" and args.action == "stats":
            return _data_stats(args)
        if args.command == "data" and args.action == "check":
            return _data_check(args, prog)
        if args.command == "data" and args.action == "rescore":
            return _data_rescore(args)
        if args.command == "probe":
            _ensure_malloc_env(argv, prog)
            return _probe_conflict(args) if args.action == "conflict" else _probe_dpo(args)
    except cli.UsageError as exc:  # a command's own argument checks (e.g. the --model directory of data stats)
        return cli.print_usage_error(exc, prog)
    except _input_errors() as exc:  # a bad input file, model directory or objective name: say which, exit 2
        return cli.print_usage_error(cli.UsageError(str(exc)), prog)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return cli.EXIT_INTERRUPTED
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:
        sys.exit(0)
