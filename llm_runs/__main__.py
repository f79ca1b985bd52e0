"""Command line of the LLM runs.

``python -m llm_runs data build``  generate the candidate responses (resumable) and score them into the data file
``python -m llm_runs data stats``  print the objectives' within-prompt rank agreement and pair counts

The process re-executes itself once with ``MALLOC_MMAP_MAX_=0`` and ``MALLOC_TRIM_THRESHOLD_=100000000000`` when
they are not set: glibc malloc otherwise stalls for seconds when large tensors are freed and re-mapped.
Usage errors exit with status 2 before any work.
"""

from __future__ import annotations

import argparse
import os
import sys

MALLOC_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "100000000000"}


def _ensure_malloc_env(argv: list[str]) -> None:
    if all(os.environ.get(k) == v for k, v in MALLOC_ENV.items()) or os.environ.get("PREFALIGN_NO_REEXEC"):
        return
    env = {**os.environ, **MALLOC_ENV, "PREFALIGN_NO_REEXEC": "1"}
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "llm_runs", *argv], env)


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return v


def _shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected I/N (e.g. 1/2), got {text!r}") from None
    if not 1 <= i <= n:
        raise argparse.ArgumentTypeError(f"expected I/N with 1 <= I <= N, got {text!r}")
    return i - 1, n


def build_parser() -> argparse.ArgumentParser:
    from llm_runs.data import DEFAULT_DATA_FILE
    from llm_runs.generate import GenerationSettings

    d = GenerationSettings()
    parser = argparse.ArgumentParser(prog="python -m llm_runs", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    data = sub.add_parser("data", help="the candidate data file: build it, or print its statistics")
    dsub = data.add_subparsers(dest="action", required=True)

    b = dsub.add_parser("build", help="generate (resumable) and score the candidates; write the data file")
    b.add_argument("--out", default=str(DEFAULT_DATA_FILE), help="data file to write (default: the shipped file)")
    b.add_argument("--work", default="runs/data-build",
                   help="directory of the resumable generation file (default: runs/data-build)")
    b.add_argument("--prompts", type=_positive_int, default=None, help="use the first N prompts (default: all)")
    b.add_argument("--responses", type=_positive_int, default=d.responses_per_prompt, help="responses per prompt")
    b.add_argument("--max-new-tokens", type=_positive_int, default=d.max_new_tokens)
    b.add_argument("--temperature", type=_positive_float, default=d.temperature)
    b.add_argument("--top-p", type=_positive_float, default=d.top_p)
    b.add_argument("--seed", type=int, default=d.seed)
    b.add_argument("--timeout", type=_positive_float, default=d.timeout_s,
                   help="wall-clock limit of one generate call in seconds; its responses are then marked cut off")
    b.add_argument("--prompts-per-call", type=_positive_int, default=d.prompts_per_call)
    b.add_argument("--threads", type=_positive_int, default=1, help="torch threads (default 1)")
    b.add_argument("--shard", type=_shard, default=(0, 1), metavar="I/N",
                   help="generate only call groups g with g %% N == I-1 (run N processes with I = 1..N, one "
                        "thread each); scoring and the data file are left to a run without --shard")
    b.add_argument("--model", default=None, help="a local Hugging Face causal-LM directory (default: SmolLM2)")
    b.add_argument("--cache-dir", default=None, help="cache of the converted default model")
    b.add_argument("--no-progress", action="store_true", help="no progress bar")

    s = dsub.add_parser("stats", help="print the within-prompt rank agreement of the objectives and pair counts")
    s.add_argument("--data", default=str(DEFAULT_DATA_FILE), help="data file (default: the shipped file)")
    s.add_argument("--json", action="store_true", help="print the statistics as JSON")
    return parser


def _data_build(args) -> int:
    import torch

    from llm_runs.build import model_identity, run_generation
    from llm_runs.generate import GenerationSettings
    from llm_runs.models import load_model
    from llm_runs.prompts import prompt_set

    settings = GenerationSettings(
        responses_per_prompt=args.responses,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        timeout_s=args.timeout,
        prompts_per_call=args.prompts_per_call,
    )
    torch.set_num_threads(args.threads)
    prompts = prompt_set(args.prompts)
    print(f"loading the model ({args.model or 'default'}) ...", file=sys.stderr, flush=True)
    model, tok = load_model(args.model, cache_dir=args.cache_dir)
    records = run_generation(model, tok, prompts, settings, args.work, model_identity(args.model),
                             shard=args.shard, progress=not args.no_progress)
    del model
    if args.shard[1] > 1:
        print(f"shard {args.shard[0] + 1}/{args.shard[1]} done; {len(records)} prompts generated in {args.work}")
        return 0
    from llm_runs.data import score_and_write

    path = score_and_write(records, settings, model_identity(args.model), args.out, progress=not args.no_progress)
    print(f"wrote {path} ({os.path.getsize(path)} bytes, {len(records)} prompts)")
    return 0


def _data_stats(args) -> int:
    import json

    from llm_runs.data import agreement_table, load_candidates

    cands = load_candidates(args.data)
    stats = agreement_table(cands)
    if args.json:
        print(json.dumps(stats, indent=1))
    else:
        print(stats["text"])
    return 0


def _input_errors() -> tuple[type[Exception], ...]:
    from llm_runs.build import GenerationFileError
    from llm_runs.data import DataFileError
    from llm_runs.models import ModelNotFoundError
    from llm_runs.rewards import UnknownObjectiveError

    return (DataFileError, GenerationFileError, ModelNotFoundError, UnknownObjectiveError)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)  # usage errors exit 2 here, before any work
    try:
        if args.command == "data" and args.action == "build":
            _ensure_malloc_env(argv)
            return _data_build(args)
        if args.command == "data" and args.action == "stats":
            return _data_stats(args)
    except _input_errors() as exc:  # a bad input file, model directory or objective name: say which, exit 2
        print(f"python -m llm_runs: error: {exc}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:
        sys.exit(0)
