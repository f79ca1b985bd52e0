r"""The candidate data file: sampled responses with their reward scores, preference pairs, rank agreement.

**File format** (schema version 1): gzip'd JSON lines. Line 1 is the header::

    {"format": "prefalign-candidates", "schema_version": 1, "created": ..., "model": {...},
     "generation": {responses_per_prompt, max_new_tokens, temperature, top_p, seed, timeout_s, prompts_per_call},
     "rewards": [{"name", "version", "definition"}, ...], "prompt_count": P, "prompt_target": N,
     "complete": P >= N, "response_count": P*K, "generation_seconds": ...}

then one line per prompt::

    {"id": "explain-00", "prompt": "...", "call": g, "call_seconds": t,
     "responses": [{"text", "n_tokens", "finished", "cut_off", "scores": {"conciseness": ..., ...}}, ...]}

(``call`` is the index of the ``generate`` call that sampled the prompt's responses, which seeds it, and
``call_seconds`` its wall-clock time.)

:func:`load_candidates` validates all of it and raises :class:`DataFileError` naming the file (and the line) on
anything missing, corrupt or of another schema. Training reads this file; it never generates.

**Preference pairs** (:func:`preference_pairs`). For an objective with reward ``r`` and a prompt with responses
``y_1..y_K``, every unordered pair with ``|r(y_a) - r(y_b)| >= margin · s_r`` gives the pair (chosen = higher
reward, rejected = lower), where ``s_r`` is the reward's *within-prompt* standard deviation pooled over prompts
(``sqrt(mean_p var_p(r))``): a margin in units of the differences that the pairs are made of.

**Rank agreement** (:func:`agreement_table`). Two objectives agree on a prompt as much as their rankings of its
responses do: Kendall's τ_b between the two rewards over the prompt's K responses, averaged over prompts (prompts
where either reward is constant are left out and counted), with its standard deviation and quartiles. Pooled
correlations over all responses mix between-prompt differences in (for example) relevance with the
within-prompt choices that preference pairs encode, and can have the other sign; they are reported beside it.
The table also gives the *pair reversal rate*: the fraction of objective a's pairs that objective b orders
the other way.

**Labels on the trained text** (:func:`trained_candidates`). A run trains on each response cut to
``max_response_tokens`` tokens (then the end-of-turn token), so its labels must score exactly that text: the
*trained text* of a response is the decoded token sequence the model sees (:func:`trained_text`: a fixed point
of encode → cut at ``T`` tokens → decode, so that the training tokenisation of the trained text is the text
itself), and every reward of a run's objectives is recomputed on it. Pairs are then built from the recomputed
scores exactly as above (the margin in the trained scores' within-prompt sd); two responses whose trained texts
are equal never form a pair. :func:`truncation_table` measures, per objective and ``T``, how many pairs survive
and how often the full-text label agrees with the reward of the trained text (what the labels were before), and
each reward's within-prompt τ with the response length (words of the trained text).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import weakref
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from llm_runs.preferences.rewards import REWARDS, UnknownObjectiveError, reward_definitions, score_responses

__all__ = [
    "DEFAULT_DATA_FILE",
    "DataFileError",
    "SCHEMA_VERSION",
    "Candidates",
    "PreferencePair",
    "UnknownObjectiveError",
    "agreement_table",
    "check_pairs",
    "load_candidates",
    "preference_pairs",
    "rank_agreement",
    "rescore_file",
    "scale_outlier",
    "score_and_write",
    "trained_candidates",
    "trained_text",
    "trained_texts",
    "truncation_table",
    "within_prompt_taus",
    "write_candidates",
]

#: The shipped data file.
DEFAULT_DATA_FILE = Path(__file__).parent.parent / "data" / "candidates.jsonl.gz"
FORMAT = "prefalign-candidates"
SCHEMA_VERSION = 1
_BUILD_HINT = "rebuild it with `python -m llm_runs data build`"


class DataFileError(ValueError):
    """The data file is missing, corrupt, or not of a known schema; the message names the file."""


@dataclass(frozen=True)
class Candidates:
    """The contents of a data file: ``P`` prompts with ``K`` responses each and their reward scores."""

    path: str
    header: dict
    prompt_ids: tuple[str, ...]
    prompts: tuple[str, ...]
    responses: tuple[tuple[str, ...], ...]  # (P, K)
    n_tokens: np.ndarray  # (P, K) int
    finished: np.ndarray  # (P, K) bool
    scores: dict[str, np.ndarray]  # objective name -> (P, K) float64
    cut_off: tuple[tuple[str | None, ...], ...] = ()  # (P, K): None, "length" or "timeout"
    calls: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (P,) generate call index
    call_seconds: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (P,) wall-clock of that call
    #: None for the file's full texts; else the response token limit T of :func:`trained_candidates`: the
    #: responses are the trained texts and ``scores`` are recomputed on them
    max_response_tokens: int | None = None
    #: the file's scores of the full texts (objective -> (P, K)); for full texts the same as ``scores``
    full_scores: dict[str, np.ndarray] = field(default_factory=dict)
    #: ``"rewards"``: the scores are the offline rewards of :mod:`llm_runs.preferences.rewards`, recomputed on the trained text;
    #: ``"annotations"``: fixed labels of the full texts (a researcher's own data, :mod:`llm_runs.preferences.formats`), which
    #: hold on the trained text only where the response is not cut
    labels: str = "rewards"
    #: ``(P, K)`` bool: which slots hold a response (None: all). Prompts of a researcher's file may have different
    #: numbers of responses; the missing slots have the text ``""`` and the score NaN
    present: np.ndarray | None = None

    @property
    def present_mask(self) -> np.ndarray:
        """``(P, K)`` bool: the slots that hold a response."""
        return np.ones(self.n_tokens.shape, dtype=bool) if self.present is None else self.present

    @property
    def objectives(self) -> tuple[str, ...]:
        return tuple(self.scores)

    def scores_of(self, objective: str) -> np.ndarray:
        if objective not in self.scores:
            raise UnknownObjectiveError(
                f"unknown objective {objective!r}; data file {self.path} holds: {', '.join(self.scores)}"
            )
        return self.scores[objective]

    def check_objectives(self, objectives) -> tuple[str, ...]:
        """Validate a list of objective names against the file (unknown or repeated names raise)."""
        objectives = tuple(objectives)
        if not objectives:
            raise ValueError("no objectives given")
        for o in objectives:
            self.scores_of(o)
        if len(set(objectives)) != len(objectives):
            raise ValueError(f"objectives repeat a name: {objectives}")
        return objectives


# --------------------------------------------------------------------------------------------------------------
# Writing


def _round(x: float) -> float:
    return float(f"{x:.7g}")


def write_candidates(path, header: dict, records: list[dict]) -> Path:
    """Write a data file (gzip'd JSON lines, reproducible bytes: no time stamp in the gzip header)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0, filename="") as f:
        f.write((json.dumps(header, ensure_ascii=False) + "\n").encode("utf-8"))
        for rec in records:
            f.write((json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8"))
    os.replace(tmp, path)
    return path


def score_and_write(records: list[dict], settings, model_info: dict, out, *, progress: bool = True,
                    prompt_target: int | None = None) -> Path:
    """Score every response of the generation ``records`` with every reward and write the data file ``out``.

    ``prompt_target`` is the number of prompts the build asked for; the header records it and whether the file
    holds them all (``complete``): a build stopped early can still write what it has (``--score-only``).
    """
    prompts = [r["prompt"] for r in records for _ in r["responses"]]
    texts = [x["text"] for r in records for x in r["responses"]]
    names = list(REWARDS)
    scores = {}
    it = names
    if progress:
        from tqdm import tqdm

        it = tqdm(names, desc="score", unit="reward", dynamic_ncols=True)
    for n in it:
        scores[n] = score_responses(prompts, texts, [n])[n]
    out_records, i = [], 0
    for r in records:
        resp = []
        for x in r["responses"]:
            resp.append({**x, "scores": {n: _round(scores[n][i]) for n in names}})
            i += 1
        out_records.append({"id": r["id"], "prompt": r["prompt"], "call": r["call"],
                            "call_seconds": r["call_seconds"], "responses": resp})
    header = {
        "format": FORMAT,
        "schema_version": SCHEMA_VERSION,
        "created": _today(),
        "model": model_info,
        "generation": settings.to_dict(),
        "rewards": reward_definitions(names),
        "prompt_count": len(records),
        "prompt_target": prompt_target if prompt_target is not None else len(records),
        "complete": prompt_target is None or len(records) >= prompt_target,
        "response_count": len(texts),
        "generation_seconds": round(sum(r["call_seconds"] for r in _first_of_call(records)), 1),
    }
    return write_candidates(out, header, out_records)


def rescore_file(path, out=None, *, progress: bool = True, keep_current: bool = True) -> Path:
    """Score every response of the data file ``path`` with every reward of :data:`llm_runs.preferences.rewards.REWARDS`
    (their current definitions and versions) and write the data file ``out`` (default: ``path``), keeping the
    texts, the generation settings and the model; the header records the date of the rescoring.

    With ``keep_current`` (the default), a reward that the file already holds at its current version keeps the
    file's scores, bit for bit: only new rewards and rewards of another version are computed (an embedder's
    scores differ in the 7th digit between runs, and adding a reward must not move the others' pairs)."""
    cands = load_candidates(path)
    names = list(REWARDS)
    held = {r["name"]: r.get("version") for r in cands.header["rewards"]}
    todo = [n for n in names if not (keep_current and held.get(n) == REWARDS[n].version)]
    prompts = [p for p, row in zip(cands.prompts, cands.responses, strict=True) for _ in row]
    texts = [r for row in cands.responses for r in row]
    it = todo
    if progress:
        from tqdm import tqdm

        it = tqdm(todo, desc="score", unit="reward", dynamic_ncols=True)
    scores = {n: score_responses(prompts, texts, [n])[n] for n in it}
    lines = [ln for ln in _read_lines(Path(path)) if ln.strip()]
    records, i = [], 0
    for line in lines[1:]:
        rec = json.loads(line)
        for x in rec["responses"]:
            x["scores"] = {n: _round(scores[n][i]) if n in scores else x["scores"][n] for n in names}
            i += 1
        records.append(rec)
    header = {**cands.header, "rewards": reward_definitions(names), "rescored": _today()}
    return write_candidates(Path(path) if out is None else Path(out), header, records)


def _first_of_call(records):
    seen = set()
    for r in records:
        if r["call"] not in seen:
            seen.add(r["call"])
            yield r


def _today() -> str:
    import time

    return time.strftime("%Y-%m-%d", time.gmtime())


# --------------------------------------------------------------------------------------------------------------
# Loading and validation


def _fail(path, msg):
    raise DataFileError(f"data file {path}: {msg}")


def _read_lines(path: Path) -> list[str]:
    if not path.exists():
        raise DataFileError(f"data file {path} does not exist; {_BUILD_HINT}")
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return f.read().splitlines()
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:
        raise DataFileError(f"data file {path} is corrupt (not a readable gzip file: {exc}); {_BUILD_HINT}") from None


def _validate_header(path, header) -> tuple[int, list[str]]:
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        _fail(path, f"line 1 is not a {FORMAT} header")
    if header.get("schema_version") != SCHEMA_VERSION:
        _fail(path, f"schema version {header.get('schema_version')!r} is not {SCHEMA_VERSION}; {_BUILD_HINT}")
    for key in ("model", "generation", "rewards", "prompt_count", "response_count"):
        if key not in header:
            _fail(path, f"header lacks {key!r}")
    k = header["generation"].get("responses_per_prompt")
    if not isinstance(k, int) or k < 2:
        _fail(path, f"header generation.responses_per_prompt is {k!r}, need an integer >= 2")
    names = [r.get("name") for r in header["rewards"] if isinstance(r, dict)]
    if not names or len(names) != len(header["rewards"]) or not all(isinstance(n, str) for n in names):
        _fail(path, "header rewards must be a list of {name, version, definition}")
    return k, names


def load_candidates(path=None) -> Candidates:
    """Load and validate a data file (default: the shipped one)."""
    path = Path(path) if path is not None else DEFAULT_DATA_FILE
    lines = [ln for ln in _read_lines(path) if ln.strip()]
    if not lines:
        _fail(path, f"is empty; {_BUILD_HINT}")
    objs = []
    for n, line in enumerate(lines, 1):
        try:
            objs.append(json.loads(line))
        except json.JSONDecodeError as exc:
            _fail(path, f"line {n} is not valid JSON ({exc.msg})")
    header, recs = objs[0], objs[1:]
    k, names = _validate_header(path, header)
    if len(recs) != header["prompt_count"]:
        _fail(path, f"header says {header['prompt_count']} prompts, the file has {len(recs)}")
    ids, prompts, texts, ntok, fin, cuts, calls, secs = [], [], [], [], [], [], [], []
    scores = {n: np.empty((len(recs), k)) for n in names}
    for i, rec in enumerate(recs):
        where = f"line {i + 2}"
        if not isinstance(rec, dict) or not isinstance(rec.get("id"), str) or not isinstance(rec.get("prompt"), str):
            _fail(path, f"{where}: a prompt record needs string fields 'id' and 'prompt'")
        resp = rec.get("responses")
        if not isinstance(resp, list) or len(resp) != k:
            _fail(path, f"{where} (prompt {rec['id']}): expected {k} responses")
        row_t, row_n, row_f, row_c = [], [], [], []
        for j, x in enumerate(resp):
            sc = x.get("scores") if isinstance(x, dict) else None
            if not isinstance(sc, dict) or not isinstance(x.get("text"), str) or not isinstance(x.get("n_tokens"), int):
                _fail(path, f"{where} (prompt {rec['id']}), response {j}: needs 'text', 'n_tokens' and 'scores'")
            for n in names:
                v = sc.get(n)
                if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v):
                    _fail(path, f"{where} (prompt {rec['id']}), response {j}: score {n!r} is {v!r}, not a finite number")
                scores[n][i, j] = v
            row_t.append(x["text"])
            row_n.append(x["n_tokens"])
            row_f.append(bool(x.get("finished", False)))
            cut = x.get("cut_off")
            if cut not in (None, "length", "timeout"):
                _fail(path, f"{where} (prompt {rec['id']}), response {j}: cut_off is {cut!r}")
            row_c.append(cut)
        ids.append(rec["id"])
        prompts.append(rec["prompt"])
        texts.append(tuple(row_t))
        ntok.append(row_n)
        fin.append(row_f)
        cuts.append(tuple(row_c))
        calls.append(int(rec.get("call", -1)))
        secs.append(float(rec.get("call_seconds", math.nan)))
    if len(set(ids)) != len(ids):
        _fail(path, "prompt ids repeat")
    if len(recs) * k != header["response_count"]:
        _fail(path, f"header says {header['response_count']} responses, the file has {len(recs) * k}")
    return Candidates(
        path=str(path),
        header=header,
        prompt_ids=tuple(ids),
        prompts=tuple(prompts),
        responses=tuple(texts),
        n_tokens=np.asarray(ntok, dtype=np.int64).reshape(len(recs), k),
        finished=np.asarray(fin, dtype=bool).reshape(len(recs), k),
        scores=scores,
        cut_off=tuple(cuts),
        calls=np.asarray(calls, dtype=np.int64),
        call_seconds=np.asarray(secs, dtype=np.float64),
    )


# --------------------------------------------------------------------------------------------------------------
# Preference pairs


@dataclass(frozen=True)
class PreferencePair:
    """A preference pair of one objective: ``chosen`` scores higher than ``rejected`` by ``gap``."""

    objective: str
    prompt_id: str
    prompt: str
    chosen: str
    rejected: str
    gap: float
    chosen_index: int
    rejected_index: int


def _scaled_row_variances(scores: np.ndarray) -> tuple[np.ndarray, int]:
    """``(v, e)``: ``v[p] = var_p(r) / 4**e``, the variance of each prompt's labelled scores (NaN where a prompt has
    fewer than two) computed on the scores divided by ``2**e``, the power of two just above the largest
    ``|score|``. Dividing by a power of two is exact, so ``v * 4**e`` is bit for bit the plain ``var_p(r)`` wherever
    that is finite; the squares of scores near 1e300 (which overflow) or near 1e-300 (which underflow) stay in range."""
    scores = np.asarray(scores, dtype=np.float64)
    finite = np.isfinite(scores)
    top = float(np.abs(scores[finite]).max()) if finite.any() else 0.0
    e = int(np.frexp(top)[1]) if top > 0 else 0
    x = np.ldexp(scores, -e)
    if finite.all():
        return np.var(x, axis=1), e
    return np.array([np.var(r[np.isfinite(r)]) if np.isfinite(r).sum() >= 2 else np.nan for r in x]), e


def within_prompt_scale(scores: np.ndarray) -> float:
    """``sqrt(mean_p var_p(r))``: the within-prompt standard deviation of a reward, pooled over prompts. A NaN
    score (no label on that slot: a missing response, or an annotated response cut by the token limit) is left out:
    ``var_p`` is then over the prompt's labelled responses, and the mean over the prompts with at least two.
    Scale-robust (:func:`_scaled_row_variances`): scores multiplied by ``2**k`` give ``2**k`` times the scale,
    exactly, from 1e-300 to 1e300, and the same float as the plain formula wherever that formula does not overflow."""
    v, e = _scaled_row_variances(scores)
    v = v[np.isfinite(v)]
    return float(np.ldexp(np.sqrt(np.mean(v)), e)) if v.size else 0.0


def scale_outlier(cands: Candidates, objective: str, *, share: float = 0.5) -> str:
    """A sentence naming the prompt whose scores of ``objective`` hold more than ``share`` of the pooled
    within-prompt variance (:func:`within_prompt_scale`), with its score farthest from the prompt's mean: one
    outlying score makes the pair margin so large that the other prompts have few pairs. ``""`` when no prompt
    holds that much."""
    s = cands.scores_of(objective)
    v, _ = _scaled_row_variances(s)
    total = float(np.nansum(v))
    if not total > 0:
        return ""
    p = int(np.nanargmax(v))
    if v[p] / total <= share:
        return ""
    row = s[p]
    k = int(np.nanargmax(np.abs(row - np.nanmedian(row))))
    return (f"prompt {cands.prompt_ids[p]!r} ({cands.prompts[p][:40]!r}) holds {v[p] / total:.0%} of the "
            f"within-prompt variance of {objective!r} (sd {within_prompt_scale(s):.4g}) with its response {k + 1}'s "
            f"score {float(row[k])!r}: the pair margin of every prompt is measured in that sd")


def preference_pairs(cands: Candidates, objective: str, *, margin: float = 0.25, prompt_ids=None) -> list[PreferencePair]:
    """Every response pair of a prompt whose reward differs by at least ``margin`` within-prompt sd's.

    ``prompt_ids`` restricts the pairs to those prompts (e.g. a client's share, or a held-out split). Pairs come
    in a fixed order (prompts in file order, then response indices).
    """
    if not margin >= 0:
        raise ValueError(f"pair margin must be >= 0, got {margin!r}")
    s = cands.scores_of(objective)
    thr = margin * within_prompt_scale(s)
    keep = None
    if prompt_ids is not None:
        keep = set(prompt_ids)
        unknown = keep - set(cands.prompt_ids)
        if unknown:
            raise ValueError(f"prompt ids not in data file {cands.path}: {sorted(unknown)[:5]}")
    pairs = []
    k = s.shape[1]
    for p, pid in enumerate(cands.prompt_ids):
        if keep is not None and pid not in keep:
            continue
        texts = cands.responses[p]
        for a in range(k):
            for b in range(a + 1, k):
                gap = s[p, a] - s[p, b]  # +-inf only where two finite scores near 1e308 differ by more
                if math.isnan(gap) or abs(gap) < thr or gap == 0 or texts[a] == texts[b]:
                    continue
                c, r = (a, b) if gap > 0 else (b, a)
                pairs.append(
                    PreferencePair(objective, pid, cands.prompts[p], cands.responses[p][c], cands.responses[p][r],
                                   float(abs(gap)), c, r)
                )
    return pairs


def check_pairs(cands: Candidates, objectives=None, *, margin: float = 0.25) -> None:
    """Raise :class:`DataFileError` naming the first objective of ``objectives`` (default: all) without any
    preference pair at ``margin`` in ``cands`` (on trained texts: after the truncation rule)."""
    for o in cands.check_objectives(objectives if objectives is not None else cands.objectives):
        if preference_pairs(cands, o, margin=margin):
            continue
        s = cands.scores_of(o)
        where = "" if cands.max_response_tokens is None else f" on the trained text (responses cut at " \
                f"{cands.max_response_tokens} tokens"
        if where and cands.labels == "annotations":
            lost = int((cands.present_mask & ~np.isfinite(s)).sum())
            where += f"; {lost} of {int(cands.present_mask.sum())} responses are longer, their labels left out"
        where += ")" if where else ""
        raise DataFileError(f"data file {cands.path}: column {o!r}: objective {o!r} has no preference pair{where} "
                            f"at a margin of {margin} within-prompt sd (labelled responses: {int(np.isfinite(s).sum())}, "
                            f"within-prompt sd {within_prompt_scale(s):.4g}); drop it from --objectives, or use a "
                            f"preset with a longer response limit")


# --------------------------------------------------------------------------------------------------------------
# Rank agreement


def within_prompt_taus(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Kendall τ_b of each row of ``a`` with the same row of ``b`` (both ``(P, K)``: prompts by responses) over the
    slots where both are labelled (finite), for every row with at least one untied pair in each (others are left
    out), in row order. All rows at once; the same integer counts and divisions as ``scipy.stats.kendalltau``'s
    τ_b, so the same floats bit for bit: ``(concordant - discordant) / sqrt(pairs untied in a) / sqrt(pairs untied
    in b)``, clipped to [-1, 1]."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.ndim != 2 or a.shape != b.shape:
        raise ValueError(f"expected two (prompts, responses) arrays of one shape; got {a.shape} and {b.shape}")
    i, j = np.triu_indices(a.shape[1], 1)
    both = np.isfinite(a) & np.isfinite(b)
    pair = both[:, i] & both[:, j]
    with np.errstate(invalid="ignore"):
        sa = np.where(pair, np.sign(a[:, i] - a[:, j]), 0.0).astype(np.int64)
        sb = np.where(pair, np.sign(b[:, i] - b[:, j]), 0.0).astype(np.int64)
    con_minus_dis = (sa * sb).sum(axis=1)
    untied_a, untied_b = (sa != 0).sum(axis=1), (sb != 0).sum(axis=1)
    keep = (untied_a > 0) & (untied_b > 0)
    tau = con_minus_dis[keep] / np.sqrt(untied_a[keep]) / np.sqrt(untied_b[keep])
    return np.clip(tau, -1.0, 1.0)


def rank_agreement(cands: Candidates, a: str, b: str) -> dict:
    """Within-prompt Kendall τ_b of objectives ``a`` and ``b`` (:func:`within_prompt_taus`): mean, sd, quartiles
    over prompts, and counts."""
    sa = cands.scores_of(a)
    t = within_prompt_taus(sa, cands.scores_of(b))
    if t.size == 0:
        return {"a": a, "b": b, "tau_mean": math.nan, "tau_sd": math.nan, "n_prompts": 0,
                "n_excluded": len(sa)}
    q25, q50, q75 = np.percentile(t, [25, 50, 75])
    return {
        "a": a,
        "b": b,
        "tau_mean": float(t.mean()),
        "tau_sd": float(t.std(ddof=1)) if t.size > 1 else math.nan,
        "tau_se": float(t.std(ddof=1) / np.sqrt(t.size)) if t.size > 1 else math.nan,
        "tau_q25": float(q25),
        "tau_median": float(q50),
        "tau_q75": float(q75),
        "frac_negative": float(np.mean(t < 0)),
        "n_prompts": int(t.size),
        "n_excluded": int(len(sa) - t.size),
    }


def _labelled(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``x`` and ``y`` at the slots where both are labelled (finite); unchanged when all are."""
    keep = np.isfinite(x) & np.isfinite(y)
    return (x, y) if keep.all() else (x[keep], y[keep])


def _reversal_rate(cands, a, b, margin):
    pa = {(p.prompt_id, p.chosen_index, p.rejected_index) for p in preference_pairs(cands, a, margin=margin)}
    pb = {(p.prompt_id, p.rejected_index, p.chosen_index) for p in preference_pairs(cands, b, margin=margin)}
    return len(pa & pb) / len(pa) if pa else math.nan


def agreement_table(cands: Candidates, objectives=None, *, margin: float = 0.25) -> dict:
    """Within-prompt rank agreement and pooled correlations of every pair of objectives, pair counts per objective.

    Returns a JSON-able dict with ``pairs`` (one entry per objective pair: the :func:`rank_agreement` fields,
    pooled Spearman ρ and Kendall τ over all responses, and the pair reversal rates both ways), ``objectives``
    (per objective: number of preference pairs at ``margin``, within-prompt sd), ``responses`` (count, cut off,
    mean tokens) and ``text`` (the same as a table).
    """
    from scipy.stats import kendalltau, spearmanr

    names = cands.check_objectives(objectives if objectives is not None else cands.objectives)
    rows = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            r = rank_agreement(cands, a, b)
            xa, xb = _labelled(cands.scores_of(a).ravel(), cands.scores_of(b).ravel())
            r["pooled_spearman"] = float(spearmanr(xa, xb).statistic)
            r["pooled_kendall"] = float(kendalltau(xa, xb).statistic)
            r["reversal_a_by_b"] = _reversal_rate(cands, a, b, margin)
            r["reversal_b_by_a"] = _reversal_rate(cands, b, a, margin)
            rows.append(r)
    words = response_words(cands)
    per_obj = {
        o: {"pairs": len(preference_pairs(cands, o, margin=margin)),
            "within_prompt_sd": within_prompt_scale(cands.scores_of(o)),
            "mean": float(np.nanmean(cands.scores_of(o))),
            "labelled": int(np.isfinite(cands.scores_of(o)).sum()),
            "tau_with_length": _within_prompt_tau(cands.scores_of(o), words)}
        for o in names
    }
    here = cands.present_mask
    n_resp = int(here.sum())
    finished = int((cands.finished & here).sum())
    resp = {
        "prompts": len(cands.prompt_ids),
        "responses": n_resp,
        "finished": finished,
        "cut_off": int(n_resp - finished),
        "cut_off_length": sum(c == "length" for row in cands.cut_off for c in row),
        "cut_off_timeout": sum(c == "timeout" for row in cands.cut_off for c in row),
        "mean_tokens": float(cands.n_tokens[here].mean()),
        "max_new_tokens": cands.header.get("generation", {}).get("max_new_tokens"),
    }
    cut_note = ("full texts" if cands.max_response_tokens is None
                else f"trained texts: responses cut at {cands.max_response_tokens} tokens, rewards recomputed"
                if cands.labels == "rewards" else
                f"trained texts: annotated responses longer than {cands.max_response_tokens} tokens left out")
    lines = [
        f"[{cut_note}] data file {cands.path}: {resp['prompts']} prompts, {n_resp} responses, "
        f"{resp['cut_off']} of {n_resp} cut off ({resp['cut_off_length']} at the token limit, "
        f"{resp['cut_off_timeout']} by a call deadline), mean {resp['mean_tokens']:.0f} new tokens "
        f"(max {resp['max_new_tokens']}), model {cands.header.get('model', {}).get('name')}",
        "",
        f"within-prompt Kendall tau_b (mean over prompts, sd, [q25, q75], share < 0), pooled correlations, "
        f"pair reversal rates (margin {margin} within-prompt sd)",
        f"{'objective a':<16} {'objective b':<16} {'tau mean':>8} {'sd':>6} {'q25':>6} {'q75':>6} {'<0':>5} "
        f"{'n':>4} {'pool rho':>8} {'pool tau':>8} {'rev a|b':>7} {'rev b|a':>7}",
    ]
    for r in rows:
        lines.append(
            f"{r['a']:<16} {r['b']:<16} {r['tau_mean']:>8.3f} {r['tau_sd']:>6.3f} {r.get('tau_q25', math.nan):>6.2f} "
            f"{r.get('tau_q75', math.nan):>6.2f} {r.get('frac_negative', math.nan):>5.2f} {r['n_prompts']:>4d} "
            f"{r['pooled_spearman']:>8.3f} {r['pooled_kendall']:>8.3f} {r['reversal_a_by_b']:>7.2f} "
            f"{r['reversal_b_by_a']:>7.2f}"
        )
    lines += ["", f"{'objective':<16} {'pairs':>6} {'within sd':>9} {'mean':>8} {'tau(length)':>11}"]
    for o, v in per_obj.items():
        lines.append(f"{o:<16} {v['pairs']:>6d} {v['within_prompt_sd']:>9.4f} {v['mean']:>8.4f} "
                     f"{v['tau_with_length']:>+11.2f}")
    return {"pairs": rows, "objectives": per_obj, "responses": resp, "margin": margin,
            "max_response_tokens": cands.max_response_tokens, "text": "\n".join(lines)}


# --------------------------------------------------------------------------------------------------------------
# Labels on the trained text


def _responses_ids(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """The token ids of each of ``texts`` (no special tokens), in one call of the tokenizer: a fast tokenizer
    encodes the batch at once, with the ids of one call per text."""
    return [list(ids) for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]] if texts else []


def trained_texts(tokenizer, texts: Sequence[str], max_tokens: int) -> tuple[list[str], list[int], list[bool]]:
    """:func:`trained_text` of each of ``texts``, with the tokenizer called once per round for every text not yet
    at its fixed point (on the shipped data file, 960 responses: about half the CPU time of one call per text).
    Returns the trained texts, their token counts (of the trained text's own encoding) and whether each text is
    longer than ``max_tokens`` tokens."""
    if int(max_tokens) != max_tokens or max_tokens < 1:
        raise ValueError(f"max_tokens must be a positive integer; got {max_tokens!r}")
    T = int(max_tokens)
    out = list(texts)
    ids = _responses_ids(tokenizer, out)
    longer = [len(i) > T for i in ids]
    n_tokens = [0] * len(out)
    todo = list(range(len(out)))
    for _ in range(8):
        again = []
        for i, row in zip(todo, ids, strict=True):
            nxt = tokenizer.decode(row[:T])
            if nxt == out[i]:
                n_tokens[i] = len(row)
            else:
                out[i] = nxt
                again.append(i)
        todo = again
        if not todo:
            return out, n_tokens, longer
        ids = _responses_ids(tokenizer, [out[i] for i in todo])
    text = texts[todo[0]]
    raise ValueError(f"no fixed point of encode/cut at {max_tokens} tokens/decode for the response {text[:60]!r}...")


def trained_text(tokenizer, text: str, max_tokens: int) -> str:
    """The text a model trained on ``text`` cut at ``max_tokens`` tokens sees: ``decode(encode(text)[:T])``,
    iterated to a fixed point (``decode(encode(t)[:T]) == t``), so that the training tokenisation of the returned
    text (:class:`llm_runs.training.objectives.PreferenceModel` encodes the response and keeps its first ``T`` tokens)
    decodes to exactly this text. Raises ``ValueError`` if no fixed point is reached in 8 rounds."""
    return trained_texts(tokenizer, [text], max_tokens)[0][0]


#: tokenizer -> (its length, its key) of the tokenizers keyed so far (the key costs 65 ms for the SmolLM2 vocabulary
#: on a 2-core Intel Xeon; a trained-candidates lookup asks for it each time); a tokenizer that gains tokens changes
#: its length and is keyed again
_TOKENIZER_KEYS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _tokenizer_key(tokenizer) -> str:
    """SHA-256 of the tokenizer's class name and its whole vocabulary (added tokens included)."""
    n = len(tokenizer)
    try:
        known = _TOKENIZER_KEYS.get(tokenizer)
    except TypeError:  # an unhashable or not weakly referenceable tokenizer: keyed each time
        known = None
    if known is not None and known[0] == n:
        return known[1]
    vocab = json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False)
    key = hashlib.sha256(f"{type(tokenizer).__name__}|{vocab}".encode()).hexdigest()
    try:
        _TOKENIZER_KEYS[tokenizer] = (n, key)
    except TypeError:
        pass
    return key


_TRAINED_CACHE: dict[tuple, Candidates] = {}


def trained_candidates(cands: Candidates, tokenizer, max_tokens: int, objectives=None) -> Candidates:
    """``cands`` with every response replaced by its trained text at ``max_tokens`` tokens (:func:`trained_text`)
    and the rewards of ``objectives`` (default: all of the file's) recomputed on those texts; ``full_scores`` keeps
    the file's scores of the full texts, ``n_tokens`` the trained token counts and ``finished`` whether the response
    ended within the limit. Results are cached per data file, limit, tokenizer vocabulary and objectives.

    Annotations (``cands.labels == "annotations"``: a researcher's labels of the full texts) cannot be recomputed
    on a cut text, so a response longer than ``max_tokens`` tokens loses its labels (score NaN for every
    objective): it forms no pair, and every pair that is left has its labels on exactly the text trained."""
    from llm_runs.preferences.rewards import score_responses

    if cands.max_response_tokens is not None:
        raise ValueError(f"the candidates are already cut at {cands.max_response_tokens} tokens")
    names = cands.check_objectives(objectives if objectives is not None else cands.objectives)
    T = int(max_tokens)
    if T != max_tokens or T < 1:
        raise ValueError(f"max_response_tokens must be a positive integer; got {max_tokens!r}")
    key = (cands.path, cands.header.get("created"), cands.header.get("digest"), cands.prompt_ids, T,
           _tokenizer_key(tokenizer), names)
    hit = _TRAINED_CACHE.get(key)
    if hit is not None:
        return hit
    P, K = len(cands.responses), len(cands.responses[0]) if cands.responses else 0
    flat, ntok, longer = trained_texts(tokenizer, [r for row in cands.responses for r in row], T)
    texts = [tuple(flat[p * K: (p + 1) * K]) for p in range(P)]
    cut = np.asarray(longer, dtype=bool).reshape(P, K)
    if cands.labels == "annotations":
        scores = {n: np.where(cut, np.nan, cands.scores[n]) for n in names}
    else:
        flat = [t for row in texts for t in row]
        prompts = [p for p in cands.prompts for _ in range(K)]
        scored = score_responses(prompts, flat, list(names))
        scores = {n: np.asarray(scored[n], dtype=np.float64).reshape(P, K) for n in names}
    out = replace(
        cands,
        responses=tuple(texts),
        n_tokens=np.asarray(ntok, dtype=np.int64).reshape(P, K),
        finished=cands.finished & ~cut,
        scores=scores,
        cut_off=tuple(tuple("length" if cut[p, k] else cands.cut_off[p][k] for k in range(K)) for p in range(P)),
        max_response_tokens=T,
        full_scores={n: cands.scores[n] for n in names},
    )
    _TRAINED_CACHE[key] = out
    return out


def _within_prompt_tau(a: np.ndarray, b: np.ndarray) -> float:
    taus = within_prompt_taus(a, b)
    return float(np.mean(taus)) if taus.size else math.nan


def response_words(cands: Candidates) -> np.ndarray:
    """``(P, K)`` word counts of the responses (the length that the τ-with-length statistic uses)."""
    from llm_runs.preferences.rewards import _words

    return np.array([[len(_words(r)) for r in row] for row in cands.responses], dtype=np.float64)


def truncation_table(cands: Candidates, tokenizer, tokens, objectives=None, *, margin: float = 0.25) -> dict:
    """Per objective and response token limit ``T`` in ``tokens``: pairs of the full texts and of the trained
    texts, the share of full-text pairs that compare two cut-off responses, the agreement of the full-text labels
    with the reward of the trained texts (ties count 1/2), and the reward's within-prompt Kendall τ with the
    response length (words of the trained text; of the full text for ``T = None``). JSON-able, with ``text``.
    For annotations (not recomputed: a pair keeps its labels, neither response cut, or is left out) the agreement
    is NaN."""
    names = cands.check_objectives(objectives if objectives is not None else cands.objectives)
    rows = []
    words_full = response_words(cands)
    full_ids = _responses_ids(tokenizer, [r for row in cands.responses for r in row])
    for T in tokens:
        tc = trained_candidates(cands, tokenizer, T, names)
        words = response_words(tc)
        cut = np.array([len(ids) > T for ids in full_ids], dtype=bool).reshape(words_full.shape)
        for o in names:
            full_pairs = preference_pairs(cands, o, margin=margin)
            trained = tc.scores_of(o)
            p_index = {pid: i for i, pid in enumerate(cands.prompt_ids)}
            agree, both_cut = [], 0
            for p in full_pairs:
                i = p_index[p.prompt_id]
                d = trained[i, p.chosen_index] - trained[i, p.rejected_index]
                if math.isfinite(d):  # annotations of a cut response are NaN: that pair is left out
                    agree.append(1.0 if d > 0 else 0.5 if d == 0 else 0.0)
                both_cut += bool(cut[i, p.chosen_index] and cut[i, p.rejected_index])
            rows.append({
                "objective": o, "max_response_tokens": int(T),
                "pairs_full_text": len(full_pairs),
                "pairs_trained_text": len(preference_pairs(tc, o, margin=margin)),
                "both_cut_share": both_cut / len(full_pairs) if full_pairs else math.nan,
                "full_label_agreement": float(np.mean(agree)) if agree and cands.labels == "rewards" else math.nan,
                "tau_with_length": _within_prompt_tau(trained, words),
                "tau_with_length_full_text": _within_prompt_tau(cands.scores_of(o), words_full),
            })
    lines = [f"labels on the trained text (margin {margin} within-prompt sd of the trained-text scores)",
             f"{'objective':<16} {'T':>4} {'pairs full':>10} {'trained':>8} {'both cut':>8} {'full label agrees':>17} "
             f"{'tau(length)':>11}"]
    for r in rows:
        lines.append(f"{r['objective']:<16} {r['max_response_tokens']:>4d} {r['pairs_full_text']:>10d} "
                     f"{r['pairs_trained_text']:>8d} {r['both_cut_share']:>8.2f} {r['full_label_agreement']:>17.2f} "
                     f"{r['tau_with_length']:>+11.2f}")
    return {"rows": rows, "margin": margin, "text": "\n".join(lines)}
