r"""Evidence rows and figure tables of the shared-iteration statements (private module).

* :class:`RowSet` — the per-instance rows of a statement's checks (``lhs ≤ rhs`` with the hypotheses monitored at
  each row) and the :class:`~verification.core.evidence.Evidence` or negative control they make;
* :func:`downsample` — figure tables of at most ``max_rows`` rows; :func:`summary` — min, median, max.
"""

from __future__ import annotations

import numpy as np

# ============================================================================================ figure tables


def downsample(table: dict, max_rows: int = 2000, key: str = "t") -> dict:
    """Keep at most ``max_rows`` rows of a column table, thinning the distinct values of ``key`` evenly."""
    cols = {k: np.asarray(v) for k, v in table.items()}
    n = len(next(iter(cols.values())))
    if n <= max_rows:
        return {k: v.tolist() for k, v in cols.items()}
    keys = np.unique(cols[key])
    per = max(1, n // keys.size)
    n_keep = max(2, max_rows // per)
    kept = keys[np.unique(np.linspace(0, keys.size - 1, n_keep).round().astype(int))]
    sel = np.isin(cols[key], kept)
    return {k: v[sel].tolist() for k, v in cols.items()}


def summary(x) -> dict:
    a = np.asarray(x, dtype=np.float64).ravel()
    a = a[np.isfinite(a)]
    if a.size == 0:
        return {"n": 0}
    return {"n": int(a.size), "min": float(a.min()), "median": float(np.median(a)), "max": float(a.max())}


def _conclusion_of(check: str) -> str:
    """``"eq 62 (c_d sweep)"`` → ``"eq 62"``: the conclusion a check label belongs to."""
    base = check.rsplit(" (", 1)[0] if check.endswith(")") and " (" in check else check
    return base.strip()


class RowSet:
    """Rows of conclusions ``lhs ≤ rhs`` from several blocks (checks), with per-row hypothesis margins.

    ``add(check, lhs, rhs, hyps, info, repro)``: ``hyps`` maps a hypothesis name to margins (``≥ 0`` where it
    holds; NaN fails) over the block's rows — a hypothesis a block does not give is *not applicable* there;
    ``info`` maps names to per-row arrays (or scalars) stored with a counterexample; ``repro`` is a JSON-able dict
    (the data that reproduces the block's instance) stored with each of its counterexamples."""

    def __init__(self):
        self.blocks: list[dict] = []

    def add(self, check: str, lhs, rhs, hyps=None, info=None, repro=None, *, conclusion: str | None = None,
            kind: str = "bound") -> None:
        """One block; ``conclusion`` names the conclusion it belongs to (default: the check label without a
        trailing parenthesis, e.g. ``"eq 62 (c_d sweep)"`` → ``"eq 62"``), ``kind`` its kind."""
        lhs = np.asarray(lhs, dtype=np.float64)
        rhs = np.broadcast_to(np.asarray(rhs, dtype=np.float64), lhs.shape).ravel()
        lhs = lhs.ravel()
        n = lhs.size
        h = {k: np.broadcast_to(np.asarray(v, dtype=np.float64), (n,)).ravel() if np.ndim(v) <= 1
             else np.asarray(v, dtype=np.float64).ravel() for k, v in (hyps or {}).items()}
        for k, v in h.items():
            if v.shape != (n,):
                raise ValueError(f"block {check!r}: hypothesis {k!r} has {v.size} margins for {n} rows")
        inf = {}
        for k, v in (info or {}).items():
            a = np.asarray(v)
            if a.ndim == 0:
                inf[k] = np.broadcast_to(a, (n,))
            elif a.size == n:
                inf[k] = a.ravel()
            else:  # one vector per row, e.g. a point w: shape (n, ...)
                inf[k] = a
            if inf[k].shape[0] != n:
                raise ValueError(f"block {check!r}: info {k!r} has {inf[k].size} entries for {n} rows")
        name = conclusion if conclusion is not None else _conclusion_of(check)
        self.blocks.append(dict(check=check, lhs=lhs, rhs=rhs, hyps=h, info=inf, repro=repro or {},
                                conclusion=name, kind=kind))

    def conclusion_args(self) -> dict:
        """``conclusion`` names (per row) and ``kinds`` for :meth:`Evidence.from_implication`."""
        names = [np.full(b["lhs"].size, b["conclusion"], dtype=object) for b in self.blocks]
        kinds: dict[str, str] = {}
        for b in self.blocks:
            if kinds.setdefault(b["conclusion"], b["kind"]) != b["kind"]:
                raise ValueError(f"conclusion {b['conclusion']!r} given as {b['kind']!r} and {kinds[b['conclusion']]!r}")
        return {"conclusion": np.concatenate(names) if names else np.zeros(0, dtype=object), "kinds": kinds}

    @property
    def n(self) -> int:
        return sum(b["lhs"].size for b in self.blocks)

    def arrays(self):
        lhs = np.concatenate([b["lhs"] for b in self.blocks]) if self.blocks else np.zeros(0)
        rhs = np.concatenate([b["rhs"] for b in self.blocks]) if self.blocks else np.zeros(0)
        return lhs, rhs

    def monitor(self):
        from verification.core.evidence import HypothesisMonitor

        mon = HypothesisMonitor(self.n)
        names: list[str] = []
        for b in self.blocks:
            for k in b["hyps"]:
                if k not in names:
                    names.append(k)
        for name in names:
            idx, mg = [], []
            start = 0
            for b in self.blocks:
                size = b["lhs"].size
                if name in b["hyps"]:
                    idx.append(np.arange(start, start + size))
                    mg.append(b["hyps"][name])
                start += size
            idx = np.concatenate(idx)
            mg = np.concatenate(mg)
            mon.record(name, np.nan_to_num(mg, nan=-np.inf) >= 0, margin=mg, index=idx)
        return mon

    def instance_data(self):
        starts = np.cumsum([0] + [b["lhs"].size for b in self.blocks])

        def rec(i: int) -> dict:
            k = int(np.searchsorted(starts, i, side="right") - 1)
            b = self.blocks[k]
            j = i - int(starts[k])
            out = {"check": b["check"], "row_in_check": j}
            out.update({name: arr[j] for name, arr in b["info"].items()})
            out["reproduce"] = b["repro"]
            return out

        return rec

    def check_counts(self, mask=None) -> dict:
        """Rows per check (and, with the monitor's mask, rows evaluated / failed)."""
        from verification.core.evidence import check_inequality

        out = {}
        start = 0
        for b in self.blocks:
            size = b["lhs"].size
            sel = slice(start, start + size)
            held = np.ones(size, bool) if mask is None else mask[sel]
            ok = check_inequality(b["lhs"], b["rhs"])
            d = out.setdefault(b["check"], {"rows": 0, "evaluated": 0, "violated": 0, "max_ratio": None})
            d["rows"] += size
            d["evaluated"] += int(held.sum())
            d["violated"] += int((held & ~ok).sum())
            pos = held & (b["rhs"] > 0)
            if pos.any():
                r = float(np.max(b["lhs"][pos] / b["rhs"][pos]))
                d["max_ratio"] = r if d["max_ratio"] is None else max(d["max_ratio"], r)
            start += size
        return out

    def evidence(self, stmt_id: str, name: str, details: dict, tightness_exclude=()):
        """Evidence of the implication over all rows. ``tightness_exclude``: substrings of check names left out of
        the headline tightness (e.g. a sharp scalar lemma); their own ratios stay in ``details["checks"]``."""
        from verification.core.evidence import Evidence

        mon = self.monitor()
        lhs, rhs = self.arrays()
        d = dict(details)
        d["checks"] = self.check_counts(mon.mask)
        tightness = "auto"
        if tightness_exclude:
            keep = np.concatenate([np.full(b["lhs"].size, not any(x in b["check"] for x in tightness_exclude))
                                   for b in self.blocks])
            sel = keep & mon.mask & (rhs > 0)
            tightness = float(np.max(lhs[sel] / rhs[sel])) if sel.any() else None
            d["tightness_excludes"] = list(tightness_exclude)
        return Evidence.from_implication(stmt_id, name, mon, lhs, rhs, instance_data=self.instance_data(), details=d,
                                         tightness=tightness, **self.conclusion_args())

    def control(self, stmt_id: str, name: str, broken, details: dict, groups=()):
        """Negative-control Evidence (:meth:`Evidence.from_control`). With ``groups`` (substrings of check
        names, e.g. the control families) the control counts as detected only if *every* group has a flagged
        row whose conclusion fails (each family must show the failure on its own)."""
        import dataclasses

        from verification.core.evidence import Evidence

        mon = self.monitor()
        lhs, rhs = self.arrays()
        broken = [broken] if isinstance(broken, str) else list(broken)
        flagged = np.zeros(self.n, bool)
        for bname in broken:
            if bname in mon.names:
                flagged |= mon.failed(bname)
        d = dict(details)
        counts = self.check_counts(flagged)
        d["checks_on_flagged_rows"] = counts
        per_group = {g: any(v["violated"] > 0 for k, v in counts.items() if g in k) for g in groups}
        if groups:
            d["detected_per_group"] = per_group
        ev = Evidence.from_control(stmt_id, name, mon, [b for b in broken if b in mon.names], lhs, rhs,
                                   instance_data=self.instance_data(), details=d, **self.conclusion_args())
        if groups and ev.control_detected and not all(per_group.values()):
            ev = dataclasses.replace(ev, control_detected=False)
        return ev
