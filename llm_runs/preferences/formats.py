r"""A researcher's own preference data: the four schemas ``--data PATH`` reads (``docs/your-data.md``).

``PATH`` is the shipped kind of data file (gzip'd JSON lines with a ``prefalign-candidates`` header, read by
:func:`llm_runs.preferences.data.load_candidates`) or anything the Hugging Face ``datasets`` library reads locally: a JSON Lines
(``.jsonl``, ``.json``, optionally ``.gz``), Parquet (``.parquet``) or CSV (``.csv``) file, a folder of such files
(one kind), or a dataset saved with ``save_to_disk`` (a folder with ``dataset_info.json`` / ``state.json``; a
``DatasetDict`` must have one split or a ``train`` split). ``datasets`` is imported only here, only then.

The schema follows from the columns (after the mapping ``--columns canonical=column,...``, e.g.
``--columns prompt=question,response=answer``):

``candidates`` (the project's own: a row per prompt)
    ``prompt`` (str), ``responses`` (a list of ``{"text": str, "scores": {objective: number}}``), optionally
    ``id`` (str). The per-prompt lines of the shipped file are rows of this schema.
``responses`` (HelpSteer2-like: a row per response)
    ``prompt``, ``response`` and one numeric column per aspect (e.g. ``helpfulness``, ``correctness``,
    ``coherence``, ``complexity``, ``verbosity``); the rows of one prompt (equal text) form its responses.
``completions`` (UltraFeedback-like: a row per prompt)
    ``instruction`` and ``completions``: a list of ``{"response": str, "annotations": {aspect: {"Rating": "4",
    ...}}}`` (the ``Rating`` a number or a string of one; an aspect may also be a number itself).
``pairs`` (PKU-SafeRLHF-like: a row per labelled pair)
    ``prompt``, ``response_0``, ``response_1`` and one label column ``<aspect>_response_id`` (0 or 1) per aspect
    (``better_response_id``, ``safer_response_id``: the objectives ``better`` and ``safer``). A label becomes
    scores: the response it names scores 1 on that objective, the other 0. Each row is one prompt with two
    responses, so the within-prompt sd of every objective is 1/2 and the pair of every row clears any margin
    below 2 sd (the default 0.25): each objective's pairs are exactly the file's labels.

``--objectives a,b,...`` picks the aspects (default: all the file has: the score keys, the numeric columns other
than the structural ones, the annotation aspects or the label columns). The scores are **annotations**: labels of
the full texts (:attr:`llm_runs.preferences.data.Candidates.labels`), never recomputed; a run trains on each response cut at
its preset's token limit, so a response longer than that loses its labels
(:func:`llm_runs.preferences.data.trained_candidates`).

Refused with :class:`~llm_runs.preferences.data.DataFileError`, one line naming the column, the row (1-based, in file order)
and the value: a file that cannot be read, columns of no schema or missing, a non-numeric or non-finite score, a
label other than 0 or 1, an empty text, a prompt with fewer than two responses, and a prompt that appears twice (as
equal text after collapsing white space): the train / held-out / evaluation split is by prompt, and a prompt
twice would put the same text on both sides of it.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
from pathlib import Path
from typing import NoReturn

import numpy as np

from llm_runs.preferences.data import DEFAULT_DATA_FILE, Candidates, DataFileError, load_candidates

__all__ = ["SCHEMAS", "normalised_text", "LABEL_SUFFIX", "data_files", "load_data", "parse_columns", "read_rows",
           "is_candidates_file"]

#: The schemas and their structural columns (the canonical names ``--columns`` maps).
SCHEMAS: dict[str, tuple[str, ...]] = {
    "candidates": ("prompt", "responses", "id"),
    "responses": ("prompt", "response"),
    "completions": ("instruction", "completions"),
    "pairs": ("prompt", "response_0", "response_1"),
}
#: The label columns of the ``pairs`` schema end so: ``better_response_id`` labels the objective ``better``.
LABEL_SUFFIX = "_response_id"
_CANONICAL = tuple(dict.fromkeys(c for cols in SCHEMAS.values() for c in cols))
_SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def parse_columns(text: str | None) -> dict[str, str]:
    """``canonical=column,...`` (``--columns``) as a dict; raises ``ValueError`` naming the bad part."""
    if not text:
        return {}
    out: dict[str, str] = {}
    for part in text.split(","):
        key, eq, col = (x.strip() for x in part.partition("="))
        if not eq or not key or not col:
            raise ValueError(f"column mapping {part.strip()!r} is not canonical=column (e.g. prompt=question)")
        if key not in _CANONICAL:
            raise ValueError(f"column mapping {part.strip()!r}: {key!r} is not one of {', '.join(_CANONICAL)}")
        if key in out:
            raise ValueError(f"column mapping names {key!r} twice")
        other = next((k for k, c in out.items() if c == col), None)
        if other is not None:
            raise ValueError(f"column mapping {other}={col},{key}={col} maps the one column {col!r} to two roles "
                             f"({other!r} and {key!r}); map each role to its own column")
        out[key] = col
    return out


def is_candidates_file(path) -> bool:
    """Whether ``path`` is read by :func:`~llm_runs.preferences.data.load_candidates` (the shipped kind of data file): None (the
    shipped file), or a ``.gz`` file whose first line is a header (a dict with ``format``) or cannot be read as
    JSON at all (then that loader names the fault); anything else goes to ``datasets``."""
    if path is None:
        return True
    p = Path(path).expanduser()
    if p.resolve() == DEFAULT_DATA_FILE.resolve():
        return True
    if not p.name.endswith(".gz") or p.is_dir():
        return False
    if not p.exists():
        return p.name.endswith(".jsonl.gz")
    try:
        with gzip.open(p, "rt", encoding="utf-8") as f:
            first = json.loads(f.readline())
    except (OSError, EOFError, ValueError, UnicodeDecodeError):
        return True
    return isinstance(first, dict) and "format" in first


def _builder(path: Path, files: list[Path]) -> str:
    kinds = set()
    for f in files:
        suffixes = [s for s in f.suffixes if s != ".gz"]
        kind = _SUFFIXES.get(suffixes[-1] if suffixes else "")
        if kind is None:
            raise DataFileError(f"data file {f}: not a file the datasets library reads here (want .jsonl, .json, "
                                f".parquet or .csv, optionally .gz)")
        kinds.add(kind)
    if len(kinds) != 1:
        raise DataFileError(f"data folder {path}: files of several kinds ({', '.join(sorted(kinds))}); keep one")
    return kinds.pop()


#: The files that make a folder a dataset saved with ``save_to_disk`` (a ``Dataset``; a ``DatasetDict``).
_SAVED_MARKS = ("dataset_info.json", "state.json", "dataset_dict.json")


def _is_saved(path: Path) -> bool:
    return path.is_dir() and any((path / m).is_file() for m in _SAVED_MARKS)


def _json_file(path: Path, what: str):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DataFileError(f"saved dataset {path.parent}: {path.name} cannot be read as {what} ({exc})") from None


def _inside(folder: Path, name, where: str) -> Path:
    """``folder / name`` where ``name`` (a file or split named in the saved dataset's ``where``) is a relative path
    that stays inside ``folder`` (symbolic links followed); else :class:`DataFileError` naming it."""
    if not isinstance(name, str) or not name:
        raise DataFileError(f"saved dataset {folder}: {where} names {name!r}, not a file name")
    target = (folder / name).resolve()
    if Path(name).is_absolute() or not target.is_relative_to(folder.resolve()):
        raise DataFileError(f"saved dataset {folder}: {where} names {name!r}, outside the folder (a saved dataset "
                            f"is read from its own folder only: save it again with save_to_disk)")
    return folder / name


def _saved_dataset(path: Path) -> tuple[Path, list[Path]]:
    """The folder of the one ``Dataset`` that :func:`read_rows` loads from the saved dataset ``path`` (``path``
    itself, or for a ``DatasetDict`` its one split or its ``train`` split) and every file that reading it opens:
    the metadata files and the Arrow files its ``state.json`` names. Raises :class:`DataFileError` for a
    ``DatasetDict`` of several splits without ``train`` and for a split or file named outside ``path``."""
    files: list[Path] = []
    folder = path
    if (path / "dataset_dict.json").is_file() and not (path / "state.json").is_file():
        splits = _json_file(path / "dataset_dict.json", "a DatasetDict's list of splits")
        splits = splits.get("splits") if isinstance(splits, dict) else None
        if not isinstance(splits, list) or not splits:
            raise DataFileError(f"saved dataset {path}: dataset_dict.json lists no splits")
        if len(splits) != 1 and "train" not in splits:
            raise DataFileError(f"data folder {path}: a saved DatasetDict of splits {splits}; save one split (or one "
                                f"named 'train')")
        folder = _inside(path, "train" if "train" in splits else splits[0], "dataset_dict.json")
        files.append(path / "dataset_dict.json")
    state = _json_file(folder / "state.json", "the state of a saved Dataset")
    entries = state.get("_data_files") if isinstance(state, dict) else None
    if not isinstance(entries, list) or not entries:
        raise DataFileError(f"saved dataset {folder}: state.json names no data files (_data_files)")
    arrow = [_inside(folder, e.get("filename") if isinstance(e, dict) else e, "state.json") for e in entries]
    files += [f for f in (folder / "state.json", folder / "dataset_info.json") if f.is_file()] + arrow
    return folder, files


def _plain_files(path: Path) -> list[Path]:
    """The data files of a path that is not a saved dataset: the file itself, or a folder's visible files (sorted;
    no sub-folders)."""
    if not path.is_dir():
        return [path]
    files = sorted(f for f in path.iterdir() if f.is_file() and not f.name.startswith("."))
    if not files:
        raise DataFileError(f"data folder {path} is empty")
    return files


def data_files(path) -> list[Path]:
    """Every file that :func:`read_rows` (or, for the shipped kind, :func:`~llm_runs.preferences.data.load_candidates`) reads
    for ``--data path``, in a fixed order: what a digest of the data must cover (``llm_runs.sweeps.sweep``). A saved
    dataset gives its metadata and the Arrow files its ``state.json`` names (one that names a file outside the
    folder is refused, :class:`DataFileError`); a folder its visible files; a file itself."""
    path = Path(DEFAULT_DATA_FILE if path is None else path).expanduser()
    if not path.exists():
        raise DataFileError(f"data file {path} does not exist")
    return _saved_dataset(path)[1] if _is_saved(path) else _plain_files(path)


def _not_utf8(path: Path, files: list[Path], exc: UnicodeDecodeError) -> DataFileError:
    """The error for a text file that is not UTF-8: the file, line and byte of the first undecodable line."""
    for f in files:
        opener = gzip.open if f.name.endswith(".gz") else open
        try:
            with opener(f, "rb") as fh:
                for n, line in enumerate(fh, 1):
                    try:
                        line.decode("utf-8")
                    except UnicodeDecodeError as bad:
                        return DataFileError(f"data file {f}: line {n}: byte {bad.start + 1} is "
                                             f"{line[bad.start:bad.start + 1]!r}, not UTF-8 text ({bad.reason}); "
                                             f"save the file as UTF-8")
        except OSError:
            continue
    return DataFileError(f"data file {path}: a text is not UTF-8 ({exc.reason} at byte {exc.start + 1} of "
                         f"{exc.object[max(0, exc.start - 20):exc.end + 20]!r}); save the file as UTF-8")


def read_rows(path) -> list[dict]:
    """The rows of ``path`` (a file, a folder of files, or a saved dataset) read by ``datasets``, as dicts.

    Nothing is written outside a temporary folder that is removed before this returns: ``datasets`` converts a
    JSON Lines, Parquet or CSV file to an Arrow file in its cache, here a fresh temporary folder (not the user's
    ``HF_DATASETS_CACHE``), and the rows are read into memory; a saved dataset is read in place."""
    path = Path(path).expanduser()
    if not path.exists():
        raise DataFileError(f"data file {path} does not exist")
    try:
        import datasets
    except ImportError as exc:  # the llm extra is not installed
        raise DataFileError(f"data file {path}: reading it needs the datasets library ({exc.name or 'datasets'} is "
                            f"missing: pip install 'prefalign-verify[llm]')") from None
    import tempfile

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    saved = _is_saved(path)
    folder, files = _saved_dataset(path) if saved else (path, _plain_files(path))
    try:
        if saved:
            return datasets.load_from_disk(str(folder)).to_list()
        builder = _builder(path, files)
        with tempfile.TemporaryDirectory(prefix="prefalign-datasets-") as cache:
            return datasets.load_dataset(builder, data_files=[str(f) for f in files], split="train",
                                         keep_in_memory=True, cache_dir=cache).to_list()
    except DataFileError:
        raise
    except UnicodeDecodeError as exc:
        raise _not_utf8(path, files, exc) from None
    except Exception as exc:  # noqa: BLE001 - whatever the reader raises, the file is named
        msg = " ".join(str(exc).split())[:300]
        raise DataFileError(f"data file {path} cannot be read by the datasets library ({type(exc).__name__}: "
                            f"{msg})") from None


# ---------------------------------------------------------------------------------------------------- values


def _fail(path, row: int, column: str, msg: str) -> NoReturn:
    raise DataFileError(f"data file {path}: row {row}: column {column!r} {msg}")


def _number(path, row: int, column: str, v) -> float:
    """A score: a finite number, or a string of one (UltraFeedback's ratings are strings)."""
    x = None
    if isinstance(v, bool):
        x = None
    elif isinstance(v, int | float | np.integer | np.floating):
        x = float(v)
    elif isinstance(v, str):
        try:
            x = float(v.strip())
        except ValueError:
            x = None
    if x is None or not math.isfinite(x):
        _fail(path, row, column, f"is {v!r}, not a finite number")
    return x


def _text(path, row: int, column: str, v) -> str:
    if not isinstance(v, str) or not v.strip():
        _fail(path, row, column, f"is {v!r}, not a non-empty text")
    return v


def normalised_text(text: str) -> str:
    """``text`` with every run of white space one blank: the key by which two prompts are the same."""
    return " ".join(text.split())


# ---------------------------------------------------------------------------------------------------- schemas


def _schema(path, cols: set[str], m: dict[str, str]) -> str:
    name = lambda c: m.get(c, c)  # noqa: E731
    if name("responses") in cols:
        return "candidates"
    if name("completions") in cols:
        return "completions"
    if name("response_0") in cols or name("response_1") in cols:
        return "pairs"
    if name("response") in cols:
        return "responses"
    raise DataFileError(
        f"data file {path}: its columns ({', '.join(sorted(cols))}) fit no schema: want 'responses' (candidates), "
        f"'response' (a row per response), 'completions' (a row per prompt with rated completions) or "
        f"'response_0'/'response_1' (labelled pairs); map other names with --columns canonical=column")


def _require(path, cols: set[str], m: dict[str, str], schema: str) -> None:
    roles: dict[str, str] = {}
    for c in SCHEMAS[schema]:
        col = m.get(c, c)
        if col in roles:
            mapping = ",".join(f"{k}={v}" for k, v in m.items())
            raise DataFileError(f"data file {path}: --columns {mapping}: the column {col!r} would be both "
                                f"{roles[col]!r} and {c!r} (schema {schema}); map each role to its own column")
        roles[col] = c
    for c in SCHEMAS[schema]:
        if c == "id":
            continue
        if m.get(c, c) not in cols:
            raise DataFileError(f"data file {path}: row 1: column {m.get(c, c)!r} is missing (schema {schema}: "
                                f"{', '.join(m.get(x, x) for x in SCHEMAS[schema] if x != 'id')}; have "
                                f"{', '.join(sorted(cols))}; map names with --columns {c}=COLUMN)")


def _pick(path, found: list[str], objectives, where: str) -> tuple[str, ...]:
    if objectives is None:
        if len(found) < 1:
            raise DataFileError(f"data file {path}: no objective found ({where})")
        return tuple(found)
    objectives = tuple(objectives)
    for o in objectives:
        if o not in found:
            raise DataFileError(f"data file {path}: row 1: column {o!r} is missing (--objectives {o}; the file has "
                                f"{', '.join(found) or 'none'}: {where})")
    if len(set(objectives)) != len(objectives):
        raise DataFileError(f"--objectives repeat a name: {','.join(objectives)}")
    return objectives


def _groups_nested(path, rows, pc: str, lc: str, text_key: str, score_key: str, objectives, rating: bool):
    """The rows of a schema with a list column ``lc`` of ``{text_key: str, score_key: {aspect: score}}`` per prompt
    (``candidates``: text/scores; ``completions``: response/annotations, the score an aspect's ``Rating``)."""
    first = rows[0][lc]
    found = []
    if isinstance(first, list) and first and isinstance(first[0], dict) and isinstance(first[0].get(score_key), dict):
        found = [a for a, v in first[0][score_key].items() if v is not None]
    names = _pick(path, found, objectives, f"the keys of {lc}[].{score_key}")
    suffix = ".Rating" if rating else ""
    groups = []
    for r, row in enumerate(rows, 1):
        prompt = _text(path, r, pc, row.get(pc))
        items = row.get(lc)
        if not isinstance(items, list):
            _fail(path, r, lc, f"is {str(items)[:80]!r}, not a list of {{{text_key}, {score_key}}}")
        texts, scores = [], []
        for j, x in enumerate(items):
            if not isinstance(x, dict) or not isinstance(x.get(score_key), dict):
                _fail(path, r, f"{lc}[{j}]", f"is {str(x)[:80]!r}, not {{{text_key}, {score_key}}}")
            texts.append(_text(path, r, f"{lc}[{j}].{text_key}", x.get(text_key)))
            sc = x[score_key]
            row_scores = []
            for o in names:
                col = f"{lc}[{j}].{score_key}.{o}{suffix}"
                if sc.get(o) is None:
                    _fail(path, r, col, "is missing")
                row_scores.append(_number(path, r, col, _rating(sc[o]) if rating else sc[o]))
            scores.append(row_scores)
        groups.append((prompt, texts, scores, r))
    return names, groups


def _groups_candidates(path, rows, m, objectives):
    ic = m.get("id", "id")
    names, groups = _groups_nested(path, rows, m.get("prompt", "prompt"), m.get("responses", "responses"), "text",
                                   "scores", objectives, rating=False)
    ids = [rows[r - 1].get(ic) for _, _, _, r in groups]
    return names, [(None if pid is None else str(pid), p, t, sc, [r])
                   for pid, (p, t, sc, r) in zip(ids, groups, strict=True)]


def _groups_responses(path, rows, m, objectives):
    pc, rc = m.get("prompt", "prompt"), m.get("response", "response")
    structural = {pc, rc, m.get("id", "id")}
    found = [c for c, v in rows[0].items() if c not in structural and not isinstance(v, bool)
             and (isinstance(v, int | float) or _is_number_text(v))]
    names = _pick(path, found, objectives, "its numeric columns")
    by_prompt: dict[str, tuple] = {}
    for r, row in enumerate(rows, 1):
        prompt = _text(path, r, pc, row.get(pc))
        text = _text(path, r, rc, row.get(rc))
        sc = [_number(path, r, o, row.get(o)) for o in names]
        g = by_prompt.setdefault(prompt, (None, prompt, [], [], []))
        g[2].append(text)
        g[3].append(sc)
        g[4].append(r)
    return names, list(by_prompt.values())


def _is_number_text(v) -> bool:
    if not isinstance(v, str):
        return False
    try:
        return math.isfinite(float(v))
    except ValueError:
        return False


def _rating(v):
    return v.get("Rating", v.get("rating")) if isinstance(v, dict) else v


def _groups_completions(path, rows, m, objectives):
    names, groups = _groups_nested(path, rows, m.get("instruction", "instruction"),
                                   m.get("completions", "completions"), "response", "annotations", objectives,
                                   rating=True)
    return names, [(None, p, t, sc, [r]) for p, t, sc, r in groups]


def _groups_pairs(path, rows, m, objectives):
    pc, r0, r1 = m.get("prompt", "prompt"), m.get("response_0", "response_0"), m.get("response_1", "response_1")
    labels = [c for c in rows[0] if c.endswith(LABEL_SUFFIX) and c not in (pc, r0, r1)]
    found = [c[: -len(LABEL_SUFFIX)] for c in labels]
    names = _pick(path, found, objectives, f"its label columns <objective>{LABEL_SUFFIX}")
    groups = []
    for r, row in enumerate(rows, 1):
        prompt = _text(path, r, pc, row.get(pc))
        texts = [_text(path, r, r0, row.get(r0)), _text(path, r, r1, row.get(r1))]
        scores = [[0.0] * len(names), [0.0] * len(names)]
        for j, o in enumerate(names):
            col = o + LABEL_SUFFIX
            v = row.get(col)
            x = _number(path, r, col, v)
            if x not in (0.0, 1.0):
                _fail(path, r, col, f"is {v!r}, not 0 or 1 (the index of the preferred response)")
            scores[int(x)][j] = 1.0
        groups.append((None, prompt, texts, scores, [r]))
    return names, groups


_GROUPS = {"candidates": _groups_candidates, "responses": _groups_responses, "completions": _groups_completions,
           "pairs": _groups_pairs}


def load_data(path=None, *, columns: dict[str, str] | str | None = None, objectives=None) -> Candidates:
    """The data of ``--data PATH`` as :class:`~llm_runs.preferences.data.Candidates` (module docstring): the shipped kind of
    file through :func:`~llm_runs.preferences.data.load_candidates` (its rewards; ``objectives`` are checked against it), any
    other through ``datasets`` in one of :data:`SCHEMAS`, its scores ``labels="annotations"``. ``columns``: the
    mapping ``{canonical: column}`` (or its ``--columns`` text); ``objectives``: the aspects to keep."""
    if isinstance(columns, str) or columns is None:
        try:
            columns = parse_columns(columns)
        except ValueError as exc:
            raise DataFileError(f"--columns: {exc}") from None
    if is_candidates_file(path):
        cands = load_candidates(path)
        if objectives is not None:
            cands.check_objectives(objectives)
        return cands
    path = Path(path).expanduser()
    rows = read_rows(path)
    if not rows:
        raise DataFileError(f"data file {path} has no rows")
    cols = set(rows[0])
    schema = _schema(path, cols, columns)
    _require(path, cols, columns, schema)
    names, groups = _GROUPS[schema](path, rows, columns, None if objectives is None else tuple(objectives))
    return _candidates(path, schema, columns, names, groups)


def _candidates(path: Path, schema: str, columns: dict, names: tuple[str, ...], groups: list) -> Candidates:
    seen: dict[str, int] = {}
    ids: list[str] = []
    pcol = columns.get("instruction", "instruction") if schema == "completions" else columns.get("prompt", "prompt")
    for k, (pid, prompt, texts, _, rows) in enumerate(groups):
        key = normalised_text(prompt)
        if key in seen:
            other = groups[seen[key]][4][0]
            raise DataFileError(f"data file {path}: row {rows[0]}: column {pcol!r} "
                                f"is {prompt[:60]!r}, the prompt of row {other} again: the train / held-out / "
                                f"evaluation split is by prompt, so a prompt may appear once (merge or drop the "
                                f"duplicate)")
        seen[key] = k
        if len(texts) < 2:
            raise DataFileError(f"data file {path}: row {rows[0]}: the prompt {prompt[:60]!r} has {len(texts)} "
                                f"response(s); every prompt needs at least two (pairs are built within a prompt)")
        ids.append(pid if pid is not None else f"{k:05d}")
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise DataFileError(f"data file {path}: column {columns.get('id', 'id')!r}: the id {dup!r} repeats")
    P, K = len(groups), max(len(g[2]) for g in groups)
    present = np.zeros((P, K), dtype=bool)
    scores = {o: np.full((P, K), np.nan) for o in names}
    texts_out = []
    for p, (_, _, texts, sc, _) in enumerate(groups):
        present[p, : len(texts)] = True
        texts_out.append(tuple(texts) + ("",) * (K - len(texts)))
        for j, o in enumerate(names):
            scores[o][p, : len(texts)] = [row[j] for row in sc]
    digest = hashlib.sha256(json.dumps([schema, sorted(columns.items()), list(names),
                                        [[g[1], g[2], g[3]] for g in groups]]).encode()).hexdigest()
    header = {"format": "researcher data", "schema": schema, "columns": columns, "objectives": list(names),
              "digest": digest, "model": {"name": None}, "generation": {"max_new_tokens": None},
              "prompt_count": P, "response_count": int(present.sum())}
    return Candidates(
        path=str(path), header=header, prompt_ids=tuple(ids), prompts=tuple(g[1] for g in groups),
        responses=tuple(texts_out), n_tokens=np.zeros((P, K), dtype=np.int64), finished=present.copy(),
        scores=scores, cut_off=tuple((None,) * K for _ in range(P)), calls=np.zeros(P, dtype=np.int64),
        call_seconds=np.full(P, math.nan), labels="annotations", present=present)
