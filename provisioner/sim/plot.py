"""Pool size over a replay as a PNG: demand against the VMs that serve it, wait warm or start.

matplotlib is imported here only, so the rest of the simulator never pays for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from provisioner.sim.replay import Sample

DAY_S = 86_400.0


def write_plot(path: str | Path, samples: Sequence[Sample], title: str) -> None:
    if not samples:
        raise ValueError("nothing to plot: the replay recorded no samples")
    import matplotlib

    matplotlib.use("Agg")  # files only; never a window
    import matplotlib.pyplot as plt

    days = [s.t_s / DAY_S for s in samples]
    fig, ax = plt.subplots(figsize=(12, 4.5), dpi=110)
    try:
        # Stacked from the bottom: what is paid for, split by what it is doing.
        ax.stackplot(days, [s.assigned for s in samples], [s.warm for s in samples],
                     [s.starting for s in samples], labels=["assigned", "warm (idle, ready)", "starting"],
                     colors=["#3b75af", "#9ecae1", "#fdae6b"], linewidth=0)
        ax.plot(days, [s.demand for s in samples], color="black", linewidth=0.8,
                label="demand (sessions running or waiting)")
        ax.set_xlabel("day of trace")
        ax.set_ylabel("VMs")
        ax.set_title(title)
        ax.set_xlim(days[0], days[-1])
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize="small", framealpha=0.9)
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)
