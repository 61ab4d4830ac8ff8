"""The fleet as a simulation run changes it: every pool's autoscaler, and the users' shares and
preemption grace period.
"""

from __future__ import annotations

from provisioner.config import FleetConfig

POLICIES = ("fixed", "headroom", "predictive")


def with_policy(fleet: FleetConfig, policy: str | None = None, headroom_fraction: float | None = None,
                warm_vms: int | None = None, wait_probability: float | None = None,
                standby: bool | None = None, max_vms: int | None = None) -> FleetConfig:
    """The fleet with every pool's autoscaler settings replaced where given. `fixed` and
    `headroom`, the baselines, run without a standby tier unless `standby` says otherwise.
    `max_vms` caps every pool (its minimum too, if above)."""
    if standby is None and policy in ("fixed", "headroom"):
        standby = False
    update = {k: v for k, v in {"autoscaler": policy, "headroom_fraction": headroom_fraction, "warm_vms": warm_vms,
                                "wait_probability": wait_probability, "standby": standby,
                                "max_vms": max_vms}.items() if v is not None}
    if policy is not None and policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
    if not update:
        return fleet
    def pool(p):
        changed = p.model_copy(update=update)
        return changed.model_copy(update={"min_vms": min(changed.min_vms, changed.max_vms)})

    clusters = tuple(c.model_copy(update={"pools": tuple(pool(p) for p in c.pools)}) for c in fleet.clusters)
    return fleet.model_copy(update={"clusters": clusters})


def with_priority(fleet: FleetConfig, share_gpus: int | None = None, grace_period_s: float | None = None) -> FleetConfig:
    """The fleet with the GPUs guaranteed to each user in every pool, and the grace period of a
    preemption, replaced where given."""
    update = {k: v for k, v in {"share_gpus_per_user": share_gpus, "grace_period_s": grace_period_s,
                                "pool_share_gpus_per_user": {} if share_gpus is not None else None}.items()
              if v is not None}
    if not update:
        return fleet
    priority = fleet.settings.priority.model_copy(update=update)
    return fleet.model_copy(update={"settings": fleet.settings.model_copy(update={"priority": priority})})
