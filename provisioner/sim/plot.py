"""A replay as a PNG an operator can act on: one row per cluster (region) and pool, with the
pool's VMs by what they do (assigned, warm, starting; standby, stopped, as a line) against its
queue, the waits of the sessions that started, and what the pool costs, over time. An
over-provisioned pool shows as warm VMs far above the queue; a starved one as a queue and waits.

matplotlib is imported here only, so the rest of the simulator never pays for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from provisioner.sim.tally import PoolSample

DAY_S = 86_400.0
COLORS = {"assigned": "#3b75af", "warm": "#9ecae1", "starting": "#fdae6b", "standby": "#7f7f7f", "queued": "#d62728"}


def write_plot(path: str | Path, pools: Mapping[str, Sequence[PoolSample]], title: str) -> None:
    """`pools`: samples by "cluster/pool" (Tally.pools)."""
    pools = {k: v for k, v in sorted(pools.items()) if v}
    if not pools:
        raise ValueError("nothing to plot: the replay recorded no samples")
    import matplotlib

    matplotlib.use("Agg")  # files only; never a window
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(pools), 3, figsize=(15, 2.4 * len(pools) + 0.8), dpi=100, sharex=True,
                             squeeze=False, gridspec_kw={"width_ratios": [3, 1.3, 1.3]})
    try:
        for row, (key, samples) in zip(axes, pools.items()):
            days = [s.t_s / DAY_S for s in samples]
            vms, waits, cost = row
            # Stacked from the bottom: what is paid for, split by what it is doing.
            vms.stackplot(days, [s.assigned for s in samples], [s.warm for s in samples],
                          [s.starting for s in samples], labels=["assigned", "warm (idle, ready)", "starting"],
                          colors=[COLORS["assigned"], COLORS["warm"], COLORS["starting"]], linewidth=0)
            # Stopped VMs bill for their disks alone: a line beside what runs, not part of the stack.
            vms.plot(days, [s.standby for s in samples], color=COLORS["standby"], linewidth=1.0, linestyle="--",
                     label="standby (stopped)")
            vms.plot(days, [s.queued for s in samples], color=COLORS["queued"], linewidth=1.0, label="queued sessions")
            vms.set_ylabel(key.replace("/", "\n"), fontsize="small")
            vms.set_ylim(bottom=0)
            waits.plot(days, [s.wait_max_s / 60.0 for s in samples], color="black", linewidth=0.8)
            waits.set_ylim(bottom=0)
            cost.plot(days, [s.cost_usd_per_h for s in samples], color="#2ca02c", linewidth=0.8)
            cost.set_ylim(bottom=0)
            for ax in row:
                ax.grid(alpha=0.3)
                ax.set_xlim(days[0], days[-1])
        top = axes[0]
        top[0].set_title("VMs and queue")
        top[1].set_title("longest wait to start (min)")
        top[2].set_title("cost ($/h)")
        top[0].legend(loc="upper left", fontsize="x-small", framealpha=0.9, ncol=2)
        for ax in axes[-1]:
            ax.set_xlabel("day of trace")
        fig.suptitle(title)
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)
