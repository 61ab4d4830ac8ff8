"""Bounds on a pool's policy, as operators change it (AdminService.SetPoolPolicy). Pure.

The API may change a policy only within what the cluster's config file allows: `min_vms` and
`max_vms` in `0 <= min_vms <= max_vms <= max_vms_limit` (the pool's ceiling, from the file, never
from the API), finite numbers, a known autoscaler.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from provisioner.config.cluster import MAX_HEADROOM_FRACTION
from provisioner.model.errors import InvalidArgument

# The fields SetPoolPolicy may change.
FIELDS = ("min_vms", "max_vms", "headroom_fraction", "autoscaler", "recycle")
AUTOSCALERS = ("fixed", "headroom", "predictive")


def merge_policy(current: Mapping[str, Any], changes: Mapping[str, Any], ceiling: int) -> dict[str, Any]:
    """`current` with `changes` applied (a None change leaves the field as it is), or
    InvalidArgument naming the field (as `policy.<field>`) that breaks a bound."""
    unknown = sorted(set(changes) - set(FIELDS))
    if unknown:
        raise InvalidArgument(f"policy has no field {unknown[0]!r}", field=f"policy.{unknown[0]}")
    given = {k: v for k, v in changes.items() if v is not None}
    merged = {**current, **given}
    for name in ("min_vms", "max_vms"):
        value = merged[name]
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidArgument(f"{name} must be a whole number, got {value!r}", field=f"policy.{name}")
        if value < 0:
            raise InvalidArgument(f"{name} must not be negative, got {value}", field=f"policy.{name}")
    if merged["max_vms"] > ceiling:
        raise InvalidArgument(f"max_vms must be <= {ceiling} (the pool's max_vms_limit in the cluster's config "
                              f"file), got {merged['max_vms']}", field="policy.max_vms")
    if merged["min_vms"] > merged["max_vms"]:
        # The culprit is the bound this call moved; if it moved both (or neither), min_vms.
        culprit = "max_vms" if "max_vms" in given and "min_vms" not in given else "min_vms"
        raise InvalidArgument(f"need min_vms <= max_vms, got min_vms {merged['min_vms']} and max_vms "
                              f"{merged['max_vms']}", field=f"policy.{culprit}")
    headroom = merged["headroom_fraction"]
    if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) or not math.isfinite(headroom) \
            or not 0.0 <= headroom <= MAX_HEADROOM_FRACTION:
        raise InvalidArgument(f"headroom_fraction must be a finite number in [0, {MAX_HEADROOM_FRACTION:g}], "
                              f"got {headroom!r}", field="policy.headroom_fraction")
    if merged["autoscaler"] not in AUTOSCALERS:
        raise InvalidArgument(f"autoscaler must be one of {', '.join(AUTOSCALERS)}, got {merged['autoscaler']!r:.64}",
                              field="policy.autoscaler")
    if not isinstance(merged["recycle"], bool):
        raise InvalidArgument(f"recycle must be true or false, got {merged['recycle']!r}", field="policy.recycle")
    merged["headroom_fraction"] = float(headroom)
    return merged
