"""The figure of an LLM run (``figure.png``), drawn from its records (``trajectory.csv``).

Left: every training client's Chebyshev value ``ψ_i`` at the server model of its cluster through Phase 1 and
Phase 2 (global round ``t``), FedAvg dashed. Right: the new clients' mean ``r̂ = ψ − ψ̂*`` against the adaptation
step ``k`` for Pipeline 1 from ``w_I`` and from ``w_II`` (the preset's preconditioner and AdamW), the local-only
and FedAvg+adaptation baselines, with Pipeline 2's final value as a horizontal line. ``r̂`` under-estimates the
true suboptimality (``ψ̂*`` is an estimate from above; see :mod:`llm_runs.runs.run`).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

__all__ = ["plot_run"]

_ADAPT = ("pipeline1_wI", "pipeline1_wII", "pipeline1_wII_adamw", "local_only", "fedavg_adapt")


def plot_run(records: pd.DataFrame, objectives, path, *, title: str = "") -> Path:
    """Draw the figure of ``records`` into ``path`` (PNG); returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    train = records[records["phase"].isin(["phase1", "phase2"])]
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for n, (i, g) in enumerate(train.groupby("client")):
        g = g.sort_values("t")
        ax1.plot(g["t"], g["psi"], "-o", ms=3, color=colours[n % len(colours)], label=f"client {int(i)}")
        fa = records[(records["phase"] == "fedavg") & (records["client"] == i)].sort_values("t")
        if len(fa):
            ax1.plot(fa["t"], fa["psi"], "--", color=colours[n % len(colours)], alpha=0.5)
    r1 = int(records.loc[records["phase"] == "phase1", "round"].max()) if (records["phase"] == "phase1").any() else 0
    ax1.axvline(r1, color="grey", lw=0.8, ls=":")
    ax1.set_xlabel("round t (Phase 1, then Phase 2 after the dotted line; FedAvg dashed)")
    ax1.set_ylabel(r"$\psi_i = \max_j \lambda_i^{(j)} l_i^{(j)}$ (client's own data)")
    ax1.set_title("training clients")
    ax1.legend(fontsize=7, ncol=2)
    for name in _ADAPT:
        g = records[records["phase"] == name]
        if not len(g):
            continue
        mean = g.groupby("round")["gap"].mean()
        ax2.plot(mean.index, mean.to_numpy(), "-o", ms=3, label=name)
    p2 = records[records["phase"] == "pipeline2"]
    if len(p2):
        last = p2[p2["round"] == p2["round"].max()]["gap"].mean()
        ax2.axhline(last, color="black", ls="--", lw=1, label="pipeline2 (data-rich), final")
    ax2.set_xlabel("adaptation step k")
    ax2.set_ylabel(r"mean $\hat r = \psi - \hat\psi^*$ of the new clients")
    ax2.set_title(r"new clients ($\hat r$ under-estimates $r$)")
    ax2.legend(fontsize=7)
    for ax in (ax1, ax2):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if title:
        fig.suptitle(f"{title}; objectives: {', '.join(objectives)}", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
