r"""Building the candidate data file: resumable generation, then scoring (``python -m llm_runs data build``).

Stage 1, generation, appends one JSON line per prompt to ``<work>/generations.jsonl`` as each ``generate``
call returns (flushed and fsync'd), after a header line with the model and the generation settings. A build
that is interrupted and started again reads the file, checks that its header matches, and generates only the
prompts not yet there; a torn last line (a kill mid-write) is dropped. Stage 2 scores every response with the
reward functions of :mod:`llm_runs.preferences.rewards` and writes the versioned data file (:mod:`llm_runs.preferences.data`).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from llm_runs.model.generate import GenerationSettings, generate_responses

__all__ = ["GenerationFileError", "generation_files", "read_generations", "read_work", "run_generation"]

_GEN_SCHEMA = 1


class GenerationFileError(ValueError):
    """The generation file of a build is unreadable or was made with other settings."""


def generation_header(model_info: dict, settings: GenerationSettings) -> dict:
    """The header line of a generation file."""
    return {"kind": "header", "schema": _GEN_SCHEMA, "model": model_info, "generation": settings.to_dict()}


def _comparable(header: dict) -> dict:
    """The part of a header that must match for a build to resume (the timeout may change between runs)."""
    gen = {k: v for k, v in header.get("generation", {}).items() if k != "timeout_s"}
    return {"schema": header.get("schema"), "model": header.get("model"), "generation": gen}


def read_generations(path: str | os.PathLike) -> tuple[dict | None, list[dict]]:
    """The header and the prompt records of a generation file (a torn last line is ignored)."""
    path = Path(path)
    if not path.exists():
        return None, []
    lines = path.read_text(encoding="utf-8").splitlines()
    header, records = None, []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            if n == len(lines):  # torn by an interrupted write: that prompt is generated again
                break
            raise GenerationFileError(f"generation file {path}: line {n} is not valid JSON") from None
        if n == 1:
            if obj.get("kind") != "header":
                raise GenerationFileError(f"generation file {path}: line 1 is not a header")
            header = obj
        else:
            records.append(obj)
    return header, records


def generation_files(work: str | os.PathLike) -> list[Path]:
    """The generation files of a build directory: ``generations.jsonl`` and the shard files beside it."""
    work = Path(work)
    return sorted(work.glob("generations*.jsonl"))


def has_timeout(record: dict) -> bool:
    """Whether a prompt record has a response cut off by the deadline of its ``generate`` call."""
    return any(x.get("cut_off") == "timeout" for x in record["responses"])


def read_work(work: str | os.PathLike, want: dict | None = None) -> list[dict]:
    """All prompt records of a build directory (every generation file; of several copies of a prompt the first
    without a deadline cut-off wins, else the first).

    With ``want`` (a header), a file whose header does not match raises :class:`GenerationFileError`.
    """
    seen: dict[str, int] = {}
    out: list[dict] = []
    for path in generation_files(work):
        header, records = read_generations(path)
        if header is not None and want is not None and _comparable(header) != _comparable(want):
            raise GenerationFileError(
                f"generation file {path} was made with other settings or another model "
                f"({_comparable(header)} != {_comparable(want)}); use another --work directory or delete it"
            )
        for r in records:
            k = seen.get(r["id"])
            if k is None:
                seen[r["id"]] = len(out)
                out.append(r)
            elif has_timeout(out[k]) and not has_timeout(r):
                out[k] = r
    return out


def seed_from_data_file(data_path: str | os.PathLike, work: str | os.PathLike, model_info: dict,
                        settings: GenerationSettings) -> int:
    """Make the prompts of an existing data file count as done in the build directory ``work``.

    A data file made with the same model and generation settings is written into ``work`` as the generation
    file ``generations-from-data.jsonl``, so a build extends the shipped file (more prompts) instead of
    regenerating it. Returns the number of prompts taken over (0 when the file is missing or was made with
    other settings).
    """
    from llm_runs.preferences.data import DataFileError, load_candidates

    try:
        cands = load_candidates(data_path)
    except DataFileError:
        return 0
    want = generation_header(model_info, settings)
    theirs = {"kind": "header", "schema": _GEN_SCHEMA, "model": cands.header["model"],
              "generation": cands.header["generation"]}
    if _comparable(theirs) != _comparable(want):
        return 0
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    with open(work / "generations-from-data.jsonl", "w", encoding="utf-8") as f:
        f.write(json.dumps(theirs) + "\n")
        for p, pid in enumerate(cands.prompt_ids):
            rec = {"id": pid, "prompt": cands.prompts[p], "call": int(cands.calls[p]),
                   "call_seconds": float(cands.call_seconds[p]), "responses": [
                {"text": cands.responses[p][k], "n_tokens": int(cands.n_tokens[p, k]),
                 "finished": bool(cands.finished[p, k]), "cut_off": cands.cut_off[p][k]}
                for k in range(cands.n_tokens.shape[1])
            ]}
            f.write(json.dumps(rec) + "\n")
    return len(cands.prompt_ids)


def run_generation(
    model,
    tokenizer,
    prompts: list[tuple[str, str]],
    settings: GenerationSettings,
    work: str | os.PathLike,
    model_info: dict,
    *,
    shard: tuple[int, int] = (0, 1),
    reverse: bool = False,
    retry_timeouts: bool = True,
    progress: bool = True,
    loader=None,
) -> list[dict]:
    """Generate the responses of every prompt not yet in the build directory ``work``; return all its records.

    Prompts are taken in consecutive groups of ``settings.prompts_per_call`` (one ``generate`` call each, seeded
    by the index of the group, so the result does not depend on how the work is split or resumed); a group whose
    prompts are all done is skipped. With ``shard = (i, n)`` this process takes the groups ``g`` with
    ``g % n == i`` and writes ``generations-<i>of<n>.jsonl`` (independent processes, e.g. one per core, each with
    one torch thread); without, ``generations.jsonl``. Every generation file of ``work`` counts as done.
    With ``model=None`` and ``tokenizer=None``, ``loader()`` returns them, called only if a prompt is missing.
    ``reverse`` takes the groups last first (and writes ``...r.jsonl``): a second process on the same shard meets
    the first in the middle. Before each call the directory is read again, so a group another process has
    finished meanwhile is skipped. With ``retry_timeouts`` a prompt whose responses were cut off by the deadline
    (a slow or stalled machine, not the model) counts as not done, and its group is sampled again with the same
    seed; the complete copy then replaces the cut one.
    """
    i_shard, n_shard = shard
    if not (0 <= i_shard < n_shard):
        raise ValueError(f"shard must be (i, n) with 0 <= i < n, got {shard}")
    work = Path(work)
    suffix = "r" if reverse else ""
    path = work / ("generations" + ("" if n_shard == 1 else f"-{i_shard}of{n_shard}") + suffix + ".jsonl")
    want = generation_header(model_info, settings)
    others = read_work(work, want)
    header, records = read_generations(path)
    def finished(records):
        return {r["id"] for r in records if not (retry_timeouts and has_timeout(r))}

    done = finished(others)
    work.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:  # rewrite without a torn tail, then append
        f.write(json.dumps(header if header is not None else want) + "\n")
        for r in records:
            f.write(json.dumps(r) + "\n")
    b = settings.prompts_per_call
    groups = [(i // b, prompts[i : i + b]) for i in range(0, len(prompts), b)]
    mine = [(g, grp) for g, grp in groups if g % n_shard == i_shard]
    todo = [(g, grp) for g, grp in mine if not all(pid in done for pid, _ in grp)]
    if reverse:
        todo.reverse()
    bar = None
    if progress:
        from tqdm import tqdm

        total = sum(len(grp) for _, grp in mine)
        bar = tqdm(total=total, initial=total - sum(len(grp) for _, grp in todo), unit="prompt",
                   desc="generate" if n_shard == 1 else f"generate {i_shard + 1}/{n_shard}", dynamic_ncols=True)
    n_timeout = 0
    if todo and model is None:
        model, tokenizer = loader()
    with open(path, "a", encoding="utf-8") as f:
        for g, grp in todo:
            done = finished(read_work(work, want))
            grp = [(pid, text) for pid, text in grp if pid not in done]
            if not grp:
                if bar is not None:
                    bar.update(len(dict(mine).get(g, ())))
                continue
            responses, seconds = generate_responses(model, tokenizer, [t for _, t in grp], settings, call_index=g)
            for (pid, text), resp in zip(grp, responses, strict=True):
                rec = {
                    "id": pid,
                    "prompt": text,
                    "call": g,
                    "call_seconds": round(seconds, 3),
                    "responses": [r.to_dict() for r in resp],
                }
                n_timeout += sum(r.cut_off == "timeout" for r in resp)
                f.write(json.dumps(rec) + "\n")
            f.flush()
            os.fsync(f.fileno())
            if bar is not None:
                bar.update(len(grp))
                bar.set_postfix(call_s=f"{seconds:.0f}", timeouts=n_timeout)
    if bar is not None:
        bar.close()
    order = {pid: i for i, (pid, _) in enumerate(prompts)}
    return sorted((r for r in read_work(work, want) if r["id"] in order), key=lambda r: order[r["id"]])


def model_identity(model_dir) -> dict:
    """What the data file records of the model that generated it."""
    from llm_runs.model.models import DEFAULT_MODEL_NAME, locate_gguf

    if model_dir is None:
        gguf = locate_gguf()
        return {"name": DEFAULT_MODEL_NAME, "source": gguf.name, "source_bytes": gguf.stat().st_size}
    return {"name": Path(model_dir).name, "source": "local directory"}


def timestamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
