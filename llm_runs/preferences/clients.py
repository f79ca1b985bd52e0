r"""Clients with data deficiency: preferences around a few centres, few-shot local data, held-out pairs, new
clients and their data-rich pools (issue item 4; docs/spec/notation.md#clients,
docs/spec/algorithm.md#algorithm).

**Preferences.** ``n_centres`` centres on the simplex: centre ``g`` puts ``centre_weight`` on objective
``g mod m`` and spreads the rest evenly, so centres differ in which objective they care about most. Client
``i`` belongs to centre ``i mod n_centres`` (training and new clients alike) and draws
``λ_i ~ Dirichlet(concentration · c_g)``, again while ``min_j λ_i^{(j)} < lambda_min`` (the preferences must lie
in the open simplex, away from its boundary: docs/spec/notation.md#clients). At the base model every loss is
``ln 2``, so the Stage-1 key and ``A_i^ref`` of Algorithm 1's clustering depend on ``λ_i`` alone, and the
centres are the structure Stage 2 can find.

**Data.** The prompts of the data file are shuffled with the run's generator and dealt out in this order:
held-out prompts (until every objective has ``heldout_pairs`` pairs on them and there are at least ``heldout_prompts``
prompts), then each training client's
prompts (until every objective has ``shots`` pairs), then each new client's (until every objective has
``pool_pairs`` pairs). Prompt sets are disjoint. From the pairs a client's prompts give
(:func:`llm_runs.preferences.data.preference_pairs`, margin ``margin`` within-prompt standard deviations) exactly that many
are drawn per objective. A client's *sample* ``k`` is its ``k``-th pair of every objective, so a batch of sample
indices (an S-shot episode, a minibatch) picks ``S`` pairs per objective and the local dataset size is
``n_i = shots`` for a training client (few-shot: the data deficiency of the paper) and ``n_i = pool_pairs`` for a
new client (the data-rich pool of Pipeline 2, from which Pipeline 1 draws its ``K`` batches of ``S``).
The held-out pairs are shared by all clients and never trained on.

**Calibration and study prompts.** :func:`calibration_split` divides a data file's prompts once and for all into a
*calibration* share, on which objectives are chosen and the positive-control gate trains and scores its oracles,
and a *study* share, from which a study's clients and held-out pairs are dealt. A prompt's side depends on its id
alone (the first 8 bytes of the SHA-256 of the id, as an integer, against the share), not on the file's order, its
other prompts or any seed: adding prompts to a file moves none, and a choice made on the calibration prompts never
saw a study's held-out prompt.

**Shared comparisons.** Each objective's pairs here are drawn independently, so two objectives of one client (and the
held-out pairs) can hold the same comparison of two responses, as the same pair or its reverse. The shots curve's
clients, whose pairs no two objectives share, are :mod:`llm_runs.preferences.heldout`'s.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from llm_runs.preferences.data import Candidates, PreferencePair, preference_pairs, scale_outlier
from sim.preference import check_preferences

__all__ = ["CALIBRATION_SHARE", "ClientDesign", "Federation", "DataShortageError", "build_federation",
           "calibration_split", "deal_shares", "draw_preferences", "pairs_by_prompt", "preference_centres", "study_prompts"]

#: The share of a data file's prompts on the calibration side of :func:`calibration_split` (80 of the shipped
#: file's 240 prompts in expectation).
CALIBRATION_SHARE = 1.0 / 3.0


def _calibration_key(prompt_id: str) -> float:
    """The prompt id's position in [0, 1): the first 8 bytes of its SHA-256 (UTF-8) over 2**64."""
    return int.from_bytes(hashlib.sha256(prompt_id.encode("utf-8")).digest()[:8], "big") / 2.0**64


def calibration_split(prompt_ids: Iterable[str], share: float = CALIBRATION_SHARE) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(calibration, study)``: the prompt ids whose key (:func:`_calibration_key`) lies below ``share``, and the
    others, each in the order given. The split of one id depends on the id and ``share`` alone (module docstring).

    Raises ``ValueError`` naming the value for a ``share`` outside (0, 1) or a repeated id."""
    share = float(share)
    if not 0.0 < share < 1.0:
        raise ValueError(f"calibration share must lie in (0, 1); got {share!r}")
    ids = [str(p) for p in prompt_ids]
    if len(set(ids)) != len(ids):
        dup = next(p for p in ids if ids.count(p) > 1)
        raise ValueError(f"prompt id {dup!r} appears more than once")
    calibration = tuple(p for p in ids if _calibration_key(p) < share)
    keep = set(calibration)
    return calibration, tuple(p for p in ids if p not in keep)


class DataShortageError(ValueError):
    """The data file has too few prompts (or pairs) for the requested clients; the message says how many."""


def _count(v, name: str, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < lo:
        raise ValueError(f"ClientDesign.{name} must be an integer >= {lo}; got {v!r}")
    return int(v)


@dataclass(frozen=True)
class ClientDesign:
    """How clients, preferences and data are drawn (see the module docstring).

    ``objectives``: the ``m`` objective names (rewards of the data file); ``n_train`` training clients and
    ``n_new`` new clients; ``n_centres`` preference centres with ``centre_weight`` on their main objective;
    ``concentration`` of the Dirichlet around a centre; ``lambda_min``: the smallest preference entry accepted;
    ``shots``: pairs per objective of a training client; ``pool_pairs``: pairs per objective of a new client;
    ``heldout_pairs``: held-out evaluation pairs per objective; ``margin``: pair margin in within-prompt sd's;
    ``heldout_prompts``: the held-out pairs come from at least this many prompts (a bootstrap over held-out prompts
    needs many).
    """

    objectives: tuple[str, ...]
    n_train: int = 4
    n_new: int = 2
    n_centres: int = 2
    centre_weight: float = 0.6
    concentration: float = 40.0
    lambda_min: float = 0.05
    shots: int = 2
    pool_pairs: int = 8
    heldout_pairs: int = 4
    margin: float = 0.25
    heldout_prompts: int = 1

    def __post_init__(self):
        objs = tuple(self.objectives)
        object.__setattr__(self, "objectives", objs)
        if len(objs) < 2 or len(set(objs)) != len(objs) or not all(isinstance(o, str) for o in objs):
            raise ValueError(f"ClientDesign.objectives must be at least two distinct names; got {self.objectives!r}")
        _count(self.n_train, "n_train", 1)
        _count(self.n_new, "n_new", 0)
        _count(self.n_centres, "n_centres", 1)
        _count(self.shots, "shots", 1)
        _count(self.pool_pairs, "pool_pairs", 1)
        _count(self.heldout_pairs, "heldout_pairs", 1)
        _count(self.heldout_prompts, "heldout_prompts", 1)
        m = len(objs)
        if not (1.0 / m <= self.centre_weight < 1.0):
            raise ValueError(f"ClientDesign.centre_weight must lie in [1/m, 1) = [{1 / m:.3g}, 1); "
                             f"got {self.centre_weight!r}")
        if not (self.concentration > 0 and np.isfinite(self.concentration)):
            raise ValueError(f"ClientDesign.concentration must be a finite number > 0; got {self.concentration!r}")
        rest = (1.0 - self.centre_weight) / (m - 1)
        if not (0 < self.lambda_min < min(rest, 1.0 / m)):
            raise ValueError(f"ClientDesign.lambda_min must lie in (0, {min(rest, 1.0 / m):.3g}) (below every centre "
                             f"entry); got {self.lambda_min!r}")
        if not self.margin >= 0:
            raise ValueError(f"ClientDesign.margin must be >= 0; got {self.margin!r}")

    @property
    def m(self) -> int:
        return len(self.objectives)

    @property
    def n_clients(self) -> int:
        return self.n_train + self.n_new


def preference_centres(m: int, n_centres: int, centre_weight: float) -> np.ndarray:
    """``(n_centres, m)``: centre ``g`` is ``centre_weight`` on objective ``g mod m``, the rest spread evenly."""
    rest = (1.0 - centre_weight) / (m - 1)
    c = np.full((n_centres, m), rest)
    c[np.arange(n_centres), np.arange(n_centres) % m] = centre_weight
    return c


@dataclass(frozen=True, eq=False)
class Federation:
    """Clients ``0..N-1`` (training clients first, then new clients), their preferences and data.

    ``prefs`` ``(N, m)``; ``centre`` ``(N,)`` the centre of each client; ``data[i][j]``: client ``i``'s pairs of
    objective ``j`` (``n_samples[i]`` of them, sample ``k`` = the ``k``-th pair of every objective);
    ``heldout[j]``: the shared held-out pairs of objective ``j``; ``prompt_ids[i]``: client ``i``'s prompts."""

    design: ClientDesign
    prefs: np.ndarray
    centres: np.ndarray
    centre: np.ndarray
    data: tuple[tuple[tuple[PreferencePair, ...], ...], ...]
    heldout: tuple[tuple[PreferencePair, ...], ...]
    prompt_ids: tuple[tuple[str, ...], ...]
    heldout_prompt_ids: tuple[str, ...]

    @property
    def objectives(self) -> tuple[str, ...]:
        return self.design.objectives

    @property
    def n_clients(self) -> int:
        return self.prefs.shape[0]

    @property
    def train(self) -> np.ndarray:
        return np.arange(self.design.n_train)

    @property
    def new(self) -> np.ndarray:
        return np.arange(self.design.n_train, self.design.n_clients)

    @property
    def n_samples(self) -> np.ndarray:
        return np.array([len(d[0]) for d in self.data], dtype=np.int64)

    def batch(self, client: int, idx=None) -> dict[str, list[PreferencePair]]:
        """``{objective: pairs}`` of client ``client``: all its pairs (``idx=None``) or samples ``idx``."""
        pairs = self.data[int(client)]
        if idx is None:
            return {o: list(p) for o, p in zip(self.objectives, pairs, strict=True)}
        idx = [int(k) for k in np.asarray(idx).ravel()]
        return {o: [p[k] for k in idx] for o, p in zip(self.objectives, pairs, strict=True)}

    def heldout_batches(self) -> dict[str, list[PreferencePair]]:
        return {o: list(p) for o, p in zip(self.objectives, self.heldout, strict=True)}

    def describe(self) -> dict:
        """JSON-able description: objectives, centres, and per client its role, centre, λ, prompts and size."""
        n_train = self.design.n_train
        return {
            "objectives": list(self.objectives),
            "centres": self.centres.tolist(),
            "clients": [
                {"client": i, "role": "train" if i < n_train else "new", "centre": int(self.centre[i]),
                 "prefs": self.prefs[i].tolist(), "samples": int(self.n_samples[i]),
                 "prompts": list(self.prompt_ids[i])}
                for i in range(self.n_clients)
            ],
            "heldout_pairs_per_objective": len(self.heldout[0]),
            "heldout_prompts": list(self.heldout_prompt_ids),
        }


def draw_preferences(design: ClientDesign, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(prefs, centres, centre)``: the clients' preferences around the design's centres (module docstring), the
    centres and each client's centre."""
    centres = preference_centres(design.m, design.n_centres, design.centre_weight)
    prefs, centre = _draw_prefs(design, centres, rng)
    return prefs, centres, centre


def _draw_prefs(design: ClientDesign, centres: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    N = design.n_clients
    centre = np.r_[np.arange(design.n_train) % design.n_centres, np.arange(design.n_new) % design.n_centres]
    prefs = np.empty((N, design.m))
    for i in range(N):
        for _ in range(10_000):
            lam = rng.dirichlet(design.concentration * centres[centre[i]])
            if lam.min() >= design.lambda_min:
                break
        else:
            raise ValueError(f"could not draw a preference with every entry >= lambda_min={design.lambda_min} "
                             f"around centre {centres[centre[i]].tolist()} (concentration {design.concentration}); "
                             f"raise the concentration or lower lambda_min")
        prefs[i] = lam / lam.sum()
    check_preferences(prefs, "client preferences")
    return prefs, centre


def study_prompts(cands: Candidates, prompt_ids: Iterable[str] | None) -> list[str]:
    """The prompts a federation is dealt from: ``prompt_ids`` (default all) in the file's order. Raises
    ``ValueError`` naming a prompt id the file does not hold."""
    dealt = list(cands.prompt_ids)
    if prompt_ids is not None:
        keep = set(prompt_ids)
        unknown = sorted(keep - set(dealt))
        if unknown:
            raise ValueError(f"prompt id {unknown[0]!r} is not in the data file {cands.path}")
        dealt = [p for p in dealt if p in keep]
    return dealt


def pairs_by_prompt(cands: Candidates, objectives: Sequence[str], margin: float) -> dict[str, list[list[PreferencePair]]]:
    """Every pair of every objective (:func:`~llm_runs.preferences.data.preference_pairs` at ``margin``), grouped by prompt
    (file order), one list per objective."""
    by_prompt: dict[str, list[list[PreferencePair]]] = {pid: [[] for _ in objectives] for pid in cands.prompt_ids}
    for j, o in enumerate(objectives):
        for p in preference_pairs(cands, o, margin=margin):
            by_prompt[p.prompt_id][j].append(p)
    return by_prompt


def build_federation(cands: Candidates, design: ClientDesign, rng: np.random.Generator, *,
                     prompt_ids: Iterable[str] | None = None) -> Federation:
    """Draw the clients' preferences and deal out the data file's prompts (see the module docstring); with
    ``prompt_ids`` (e.g. the study side of :func:`calibration_split`), only those prompts, in the file's order
    before the shuffle.

    Raises :class:`DataShortageError` when the prompts run out, naming what was asked and what the file holds, and
    ``ValueError`` naming a prompt id the file does not hold."""
    objectives = cands.check_objectives(design.objectives)
    dealt = study_prompts(cands, prompt_ids)
    prefs, centres, centre = draw_preferences(design, rng)
    by_prompt = pairs_by_prompt(cands, objectives, design.margin)  # drawn from once
    order = [dealt[k] for k in rng.permutation(len(dealt))]
    pos = 0

    def deal(need: int, who: str, min_prompts: int = 1) -> tuple[tuple[str, ...], tuple[tuple[PreferencePair, ...], ...]]:
        nonlocal pos
        ids: list[str] = []
        have = [0] * len(objectives)
        while min(have) < need or len(ids) < min_prompts:
            if pos == len(order):
                short = objectives[int(np.argmin(have))]
                with_pairs = sum(bool(by_prompt[pid][objectives.index(short)]) for pid in order)
                outlier = scale_outlier(cands, short)
                raise DataShortageError(
                    f"the data file {cands.path} ({len(order)} prompts) runs out of prompts at {who}: every objective "
                    f"needs {need} pairs there (held-out {design.heldout_pairs} from at least {design.heldout_prompts} "
                    f"prompts, {design.n_train} training clients x "
                    f"{design.shots}, {design.n_new} new clients x {design.pool_pairs} pairs per objective, objectives "
                    f"{list(objectives)}); {short!r} has pairs in {with_pairs} of {len(order)} prompts"
                    + (f" ({outlier})" if outlier else "") + "; use fewer clients or pairs, or a larger data file"
                )
            pid = order[pos]
            pos += 1
            ids.append(pid)
            have = [h + len(by_prompt[pid][j]) for j, h in enumerate(have)]
        pairs = []
        for j in range(len(objectives)):
            pool = [p for pid in ids for p in by_prompt[pid][j]]
            take = np.sort(rng.choice(len(pool), size=need, replace=False))
            pairs.append(tuple(pool[k] for k in take))
        return tuple(ids), tuple(pairs)

    held_ids, heldout, ids, data = deal_shares(design, deal)
    return Federation(design=design, prefs=prefs, centres=centres, centre=centre, data=data, heldout=heldout,
                      prompt_ids=ids, heldout_prompt_ids=held_ids)


def deal_shares(design: ClientDesign, deal: Callable) -> tuple:
    """``(held-out prompt ids, held-out pairs, each client's prompt ids, each client's pairs)``: ``deal(need, who,
    min_prompts=1) -> (prompt ids, pairs per objective)`` called for the held-out share (``heldout_pairs`` from at
    least ``heldout_prompts`` prompts), then for every client in order (``shots`` for a training client,
    ``pool_pairs`` for a new one)."""
    held_ids, heldout = deal(design.heldout_pairs, "the held-out pairs", design.heldout_prompts)
    data, ids = [], []
    for i in range(design.n_clients):
        role, need = ("training client", design.shots) if i < design.n_train else ("new client", design.pool_pairs)
        pid, pairs = deal(need, f"{role} {i}")
        ids.append(pid)
        data.append(pairs)
    return held_ids, heldout, tuple(ids), tuple(data)
