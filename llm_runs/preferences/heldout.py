r"""Pairs a client owns: separable per-objective pairs, the λ-weighted accuracy, and the shots curve's clients.

**Comparisons.** Every preference pair compares two responses of one prompt; its *comparison* is
``(prompt id, smaller response index, larger response index)``, the same whichever response is chosen. With ``K``
responses a prompt holds ``K(K-1)/2`` comparisons (6 for the shipped file's 4), and every objective's pairs
(:func:`llm_runs.preferences.data.preference_pairs`) are drawn from them: :func:`llm_runs.preferences.clients.build_federation` lets two
objectives of one client hold the same comparison, as the same pair or its reverse, so that training or scoring one
objective moves the other's margin on the identical texts.

**Separable pairs** (:func:`separable_pairs`). A client's pairs are *separable* when no comparison appears in two
objectives' lists, in either order. Each objective's eligible pairs are its margin-rule pairs
(``margin`` within-prompt sd's, labelled by that objective's reward alone); a comparison eligible for several
objectives goes to at most one of them, chosen by a **round-robin draw**: in round ``k`` each objective that still
needs pairs, in order of scarcity (fewest eligible comparisons first; ties in the design's order), draws one of its
eligible comparisons not yet taken, uniformly at random among those whose taking leaves every objective's remaining
count reachable. Reachability is Hall's condition for this assignment problem, which is exact: counts
``n_j`` can be met by distinct comparisons if and only if for every set ``S`` of objectives the comparisons
eligible for at least one objective of ``S`` number at least ``Σ_{j∈S} n_j``. So the draw never fails when the
counts can be met, and :class:`~llm_runs.preferences.clients.DataShortageError` names the objectives (and their counts) when they
cannot. An objective's ``k``-th pair is the one it drew in round ``k``: the first ``b`` pairs of every objective
are again separable, and a budget of ``b`` pairs contains every smaller budget.

The draw neither prefers large margins (assigning a shared comparison to the objective with the larger standardised
margin would give each objective its easy comparisons and the scarce objectives too few) nor labels a comparison by
anything but the objective it goes to.

**Each client's own preference** (:func:`lambda_weighted_accuracy`, :func:`scalarised_pairs`). The curve's primary
accuracy of a model for client ``i`` is ``Σ_j λ_ij acc_j``, where ``acc_j`` is the model's preference accuracy on
objective ``j``'s separable held-out pairs. The alternative, pairs labelled by the client's standardised
scalarised reward ``Σ_j λ_ij r_j / s_j`` (``s_j`` the within-prompt scale of objective ``j``), is built too, but is
secondary: (1) ``acc_j`` is computed once per model and every client's accuracy is its dot product with ``λ_i``, so
the accuracy is linear in ``λ`` and a slope on ``λ`` reads per-objective effects, while the scalarised label of a
comparison flips at a ``λ``-dependent threshold; (2) with separable sets an objective's accuracy is measured on
comparisons no other objective's label touches, whereas the scalarised pairs of the clients of one centre are
mostly the same comparisons labelled by that centre's main objective, so the accuracy cannot say which objective
moved; (3) the scalarised label depends on the scales ``s_j``, estimated on the data file, and a model that learns
one objective's order of responses exactly still scores only partly on it.

**The shots curve's clients** (:class:`ShotsDesign`, :func:`build_shots_federation`). Training clients hold
``shots`` separable pairs per objective; a new client a pool of ``max(budgets)`` separable pairs per
objective, of which budget ``b`` is its first ``b`` samples (``Federation.batch(i, range(b))``), so every budget of
one client is a subset of the larger ones and the curve compares budgets on the same client. The held-out pairs are
one separable set on prompts no client trains on, shared by every client; client ``i`` scores them by its own ``λ_i``
(the λ-weighted accuracy). They are shared, not one set per client, because the study side cannot hold both: its 150
prompts give at most 296 separable pairs per objective in all (docs/llm-study.md, "Held-out pairs a client owns"),
9 new clients' pools of 16 take about half of that, and 9 own held-out sets would leave each too few pairs to
resolve an accuracy; on shared pairs every client's accuracies are paired with every other's and with the base
model's, and each model is scored once. Prompts are dealt as :func:`~llm_runs.preferences.clients.build_federation` deals them
(shuffled by the run's generator: held-out, then training clients, then new clients, disjoint), each share until its
separable counts are reachable.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from llm_runs.preferences.clients import (
    ClientDesign,
    DataShortageError,
    Federation,
    deal_shares,
    draw_preferences,
    pairs_by_prompt,
    study_prompts,
)
from llm_runs.preferences.data import Candidates, PreferencePair, preference_pairs, within_prompt_scale
from sim.preference import check_preferences

__all__ = ["SHOTS_CLIENTS", "ShotsDesign", "build_shots_federation", "comparison", "lambda_weighted_accuracy", "scalarised_pairs",
           "separable_pairs", "shared_comparisons", "separable_capacity"]

Comparison = tuple[str, int, int]


def comparison(pair: PreferencePair) -> Comparison:
    """``(prompt id, smaller response index, larger response index)``: the pair and its reverse give the same."""
    a, b = sorted((pair.chosen_index, pair.rejected_index))
    return pair.prompt_id, a, b


def shared_comparisons(pairs_by_objective: Iterable[Iterable[PreferencePair]]) -> set[Comparison]:
    """The comparisons that appear in the lists of two objectives (in either order); empty for separable pairs."""
    seen: dict[Comparison, int] = {}
    shared = set()
    for j, pairs in enumerate(pairs_by_objective):
        for c in {comparison(p) for p in pairs}:
            if seen.setdefault(c, j) != j:
                shared.add(c)
    return shared


class _Eligibility:
    """The comparisons of a set of pools and which objectives each is eligible for (a bit mask), with Hall's
    condition in matrix form: ``hits[S, mask]`` is 1 where the mask meets the objective set ``S`` (both as bit
    masks 1..2^m-1), ``member[S, j]`` 1 where objective ``j`` lies in ``S``."""

    def __init__(self, m: int):
        self.m = m
        subsets = np.arange(1, 2**m)
        self.hits = ((subsets[:, None] & subsets[None, :]) != 0).astype(np.int64)
        self.member = ((subsets[:, None] >> np.arange(m)[None, :]) & 1).astype(np.int64)
        self.count = np.zeros(2**m - 1, dtype=np.int64)  # comparisons per mask (index mask - 1)

    def add(self, mask: int, n: int = 1) -> None:
        self.count[mask - 1] += n

    def slack(self, need: np.ndarray) -> np.ndarray:
        """Per objective set ``S``: comparisons eligible for ``S`` minus the pairs ``S`` needs (Hall: all >= 0)."""
        return self.hits @ self.count - self.member @ need

    def short(self, need: np.ndarray) -> int | None:
        """The smallest objective set (bit mask) whose comparisons cannot give its pairs, or None."""
        bad = np.flatnonzero(self.slack(need) < 0) + 1
        return None if not bad.size else int(min(bad, key=lambda s: (bin(s).count("1"), s)))

    def shortage(self, need: np.ndarray, objectives: Sequence[str], where: str) -> str:
        s = self.short(need)
        assert s is not None
        idx = [j for j in range(self.m) if s >> j & 1]
        have = int(self.hits[s - 1] @ self.count)
        quoted = [repr(objectives[j]) for j in idx]
        names = quoted[0] if len(idx) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]
        counts = " + ".join(str(int(need[j])) for j in idx)
        which = "objective" if len(idx) == 1 else "objectives"
        return (f"{where}: {which} {names} need{'s' if len(idx) == 1 else ''} {counts} separable pairs and "
                f"{'its' if len(idx) == 1 else 'their'} eligible comparisons number {have}")


def _need(counts, m: int) -> np.ndarray:
    need = np.broadcast_to(np.asarray(counts), (m,))
    if need.dtype.kind not in "iu" or (need < 0).any():
        raise ValueError(f"pair counts must be integers >= 0, one or one per objective; got {counts!r}")
    return need.astype(np.int64).copy()


def _eligible(pools: Sequence[Sequence[PreferencePair]]) -> tuple[list[Comparison], dict[Comparison, int],
                                                                   list[dict[Comparison, PreferencePair]]]:
    comps: list[Comparison] = []
    masks: dict[Comparison, int] = {}
    by_comp: list[dict[Comparison, PreferencePair]] = []
    for j, pool in enumerate(pools):
        mine: dict[Comparison, PreferencePair] = {}
        for p in pool:
            c = comparison(p)
            if c not in masks:
                comps.append(c)
                masks[c] = 0
            masks[c] |= 1 << j
            mine.setdefault(c, p)
        by_comp.append(mine)
    return comps, masks, by_comp


def separable_capacity(pools: Sequence[Sequence[PreferencePair]]) -> int:
    """The largest ``n`` such that every objective can hold ``n`` separable pairs of ``pools`` (Hall's condition:
    the minimum over objective sets ``S`` of ``⌊comparisons eligible for S / |S|⌋``)."""
    _, masks, _ = _eligible(pools)
    el = _Eligibility(len(pools))
    for mask in masks.values():
        el.add(mask)
    return int(np.min(el.hits @ el.count // el.member.sum(axis=1)))


def separable_pairs(pools: Sequence[Sequence[PreferencePair]], counts, rng: np.random.Generator, *,
                    objectives: Sequence[str] | None = None, where: str = "the pairs"
                    ) -> tuple[tuple[PreferencePair, ...], ...]:
    """Per objective ``j``, ``counts[j]`` (or ``counts`` for all) pairs of ``pools[j]`` such that no comparison is in
    two objectives' lists: the round-robin draw of the module docstring, deterministic given ``rng``. ``pools[j]``
    are objective ``j``'s eligible pairs (e.g. :func:`~llm_runs.preferences.data.preference_pairs` on the client's prompts).

    Raises :class:`~llm_runs.preferences.clients.DataShortageError` naming the objectives (from ``objectives``, default
    ``0..m-1``), the pairs they need and the comparisons they have, prefixed by ``where``, when no separable choice
    exists."""
    m = len(pools)
    names = [str(o) for o in objectives] if objectives is not None else [str(j) for j in range(m)]
    need = _need(counts, m)
    comps, masks, by_comp = _eligible(pools)
    el = _Eligibility(m)
    for mask in masks.values():
        el.add(mask)
    if el.short(need) is not None:
        raise DataShortageError(el.shortage(need, names, where))
    order = sorted(range(m), key=lambda j: (len(by_comp[j]), j))
    free = [[c for c in comps if c in by_comp[j]] for j in range(m)]  # eligible, not taken: first-seen order
    out: list[list[PreferencePair]] = [[] for _ in range(m)]
    for _ in range(int(need.max(initial=0))):
        for j in order:
            if need[j] == 0:
                continue
            # the masks whose taking keeps Hall's condition: slack - hits[:, mask] + member[:, j] >= 0 for every S
            ok = (el.slack(need)[:, None] - el.hits + el.member[:, [j]] >= 0).all(axis=0)
            cand = [c for c in free[j] if ok[masks[c] - 1]]
            c = cand[int(rng.integers(len(cand)))]
            out[j].append(by_comp[j][c])
            need[j] -= 1
            el.add(masks[c], -1)
            for k in range(m):
                if masks[c] >> k & 1:
                    free[k].remove(c)
    return tuple(tuple(p) for p in out)


def lambda_weighted_accuracy(prefs, accuracies: Mapping[str, float | Mapping], objectives: Sequence[str]) -> float:
    """``Σ_j λ_j acc_j``: a client's held-out preference accuracy under its own preference ``prefs`` (``λ``, one
    entry per objective of ``objectives``), from the per-objective accuracies on separable held-out pairs
    (``accuracies[o]`` a number, or the ``{"accuracy": ...}`` entry of
    :meth:`llm_runs.training.objectives.PreferenceModel.evaluate`, whose ties count 1/2). The curve's primary accuracy
    (module docstring). Raises ``ValueError`` for a ``λ`` off the open simplex, of the wrong length, or a missing
    or non-finite accuracy."""
    lam = check_preferences(np.asarray(prefs, dtype=np.float64), "client preference")
    if lam.ndim != 1 or lam.size != len(objectives):
        raise ValueError(f"client preference has {lam.size} entries for {len(objectives)} objectives {list(objectives)}")
    acc = np.empty(len(objectives))
    for j, o in enumerate(objectives):
        if o not in accuracies:
            raise ValueError(f"no held-out accuracy of objective {o!r}")
        a = accuracies[o]
        acc[j] = float(a["accuracy"] if isinstance(a, Mapping) else a)
        if not 0.0 <= acc[j] <= 1.0:
            raise ValueError(f"held-out accuracy of objective {o!r} is {float(acc[j])!r}, not in [0, 1]")
    return float(lam @ acc)


#: The name of the scalarised reward's pairs (:attr:`PreferencePair.objective`).
SCALARISED = "scalarised"


def scalarised_pairs(cands: Candidates, objectives: Sequence[str], prefs, *, margin: float = 0.25,
                     prompt_ids=None) -> list[PreferencePair]:
    """Pairs labelled by a client's standardised scalarised reward ``Σ_j λ_j r_j / s_j`` (``s_j`` the within-prompt
    scale of objective ``j`` on ``cands``, :func:`~llm_runs.preferences.data.within_prompt_scale`), by the margin rule of
    :func:`~llm_runs.preferences.data.preference_pairs` applied to that reward (its own within-prompt scale), on ``prompt_ids``
    (default all). The secondary labelling of the module docstring; the pairs' objective is ``"scalarised"``."""
    objectives = cands.check_objectives(objectives)
    lam = check_preferences(np.asarray(prefs, dtype=np.float64), "client preference")
    if lam.ndim != 1 or lam.size != len(objectives):
        raise ValueError(f"client preference has {lam.size} entries for {len(objectives)} objectives {list(objectives)}")
    total = np.zeros(cands.scores_of(objectives[0]).shape)
    for w, o in zip(lam, objectives, strict=True):
        s = within_prompt_scale(cands.scores_of(o))
        if not s > 0:
            raise ValueError(f"objective {o!r} has no within-prompt spread (scale {s!r}): it cannot be standardised")
        total = total + w * cands.scores_of(o) / s
    scalar = replace(cands, scores={SCALARISED: total})
    return preference_pairs(scalar, SCALARISED, margin=margin, prompt_ids=prompt_ids)


def _budgets(v) -> tuple[int, ...]:
    b = tuple(v) if isinstance(v, Iterable) else (v,)
    if not b or any(isinstance(x, bool) or not isinstance(x, int | np.integer) or x < 1 for x in b) \
            or list(b) != sorted(set(b)):
        raise ValueError(f"ShotsDesign.budgets must be increasing integers >= 1; got {v!r}")
    return tuple(int(x) for x in b)


#: The shots curve's clients apart from their objectives: 6 training clients of 8 separable pairs per objective and
#: 9 new clients around 3 centres, 64 held-out pairs per objective from at least 25 prompts: what the study side of
#: the shipped file holds at margin 0.25 (docs/llm-study.md, "Held-out pairs a client owns").
SHOTS_CLIENTS = dict(n_train=6, n_new=9, n_centres=3, shots=8, heldout_pairs=64, heldout_prompts=25)


@dataclass(frozen=True)
class ShotsDesign:
    """The shots curve's federation (module docstring): the clients, preferences and held-out share of ``clients``
    (:class:`~llm_runs.preferences.clients.ClientDesign`; ``shots`` separable pairs per objective of a training client,
    ``heldout_pairs`` separable held-out pairs per objective from at least ``heldout_prompts`` prompts, shared), and
    a new client's pool of ``max(budgets)`` separable pairs per objective, whose first ``b`` samples are budget
    ``b``: ``clients.pool_pairs`` is set to ``max(budgets)``. :meth:`for_objectives` gives the measured design."""

    clients: ClientDesign
    budgets: tuple[int, ...] = (1, 2, 4, 8, 16)

    def __post_init__(self):
        budgets = _budgets(self.budgets)
        object.__setattr__(self, "budgets", budgets)
        object.__setattr__(self, "clients", replace(self.clients, pool_pairs=budgets[-1]))

    @classmethod
    def for_objectives(cls, objectives: Sequence[str], budgets: Iterable[int] = (1, 2, 4, 8, 16),
                       **clients) -> ShotsDesign:
        """The design of :data:`SHOTS_CLIENTS` for ``objectives``, with any of its fields replaced by ``clients``."""
        return cls(ClientDesign(objectives=tuple(objectives), **{**SHOTS_CLIENTS, **clients}), tuple(budgets))

    @property
    def objectives(self) -> tuple[str, ...]:
        return self.clients.objectives

    def budget_samples(self, budget: int) -> np.ndarray:
        """The sample indices of a new client's budget ``budget`` (its first ``budget`` pairs per objective)."""
        if budget not in self.budgets:
            raise ValueError(f"budget {budget!r} is not one of the design's budgets {list(self.budgets)}")
        return np.arange(budget)


def build_shots_federation(cands: Candidates, design: ShotsDesign, rng: np.random.Generator, *,
                           prompt_ids: Iterable[str] | None = None) -> Federation:
    """The shots curve's clients (module docstring), dealt from ``prompt_ids`` (e.g. the study side of
    :func:`~llm_runs.preferences.clients.calibration_split`; default every prompt of ``cands``): a
    :class:`~llm_runs.preferences.clients.Federation` whose every client's pairs and whose held-out pairs are separable.

    Raises :class:`~llm_runs.preferences.clients.DataShortageError` naming the share and the objectives whose separable pairs
    the prompts cannot give, and ``ValueError`` naming a prompt id the file does not hold."""
    clients = design.clients
    objectives = cands.check_objectives(clients.objectives)
    dealt = study_prompts(cands, prompt_ids)
    prefs, centres, centre = draw_preferences(clients, rng)
    pools = pairs_by_prompt(cands, objectives, clients.margin)
    order = [dealt[k] for k in rng.permutation(len(dealt))]
    pos = 0

    def deal(need: int, who: str, min_prompts: int = 1):
        nonlocal pos
        ids: list[str] = []
        el = _Eligibility(len(objectives))
        want = np.full(len(objectives), need, dtype=np.int64)
        while el.short(want) is not None or len(ids) < min_prompts:
            if pos == len(order):
                raise DataShortageError(
                    el.shortage(want, objectives, f"the {len(order)} prompts dealt run out at {who}")
                    + f" on its {len(ids)} prompts (held-out {clients.heldout_pairs} pairs per objective from at least "
                    f"{clients.heldout_prompts} prompts, {clients.n_train} training clients x {clients.shots}, "
                    f"{clients.n_new} new clients x {clients.pool_pairs}); use fewer clients or pairs")
            pid = order[pos]
            pos += 1
            ids.append(pid)
            for mask in _eligible(pools[pid])[1].values():
                el.add(mask)
        merged = [[p for pid in ids for p in pools[pid][j]] for j in range(len(objectives))]
        return tuple(ids), separable_pairs(merged, need, rng, objectives=objectives, where=who)

    held_ids, heldout, ids, data = deal_shares(clients, deal)
    return Federation(design=clients, prefs=prefs, centres=centres, centre=centre, data=data, heldout=heldout,
                      prompt_ids=ids, heldout_prompt_ids=held_ids)
