"""Request checks shared by the front and the clusters, so both refuse the same things."""

from __future__ import annotations

from typing import TYPE_CHECKING, Collection

from provisioner.model.errors import InvalidArgument, quote
from provisioner.model.images import ImageCatalog
from provisioner.model.records import SessionKind, SessionSpec

if TYPE_CHECKING:
    from provisioner.config.policy import PriorityConfig


def pool_named(asked: str, pool_accelerators: dict[str, str]) -> str:
    """The pool a create's accelerator names: a pool name (`gpu-p100`) as it is, or an accelerator
    type (`nvidia-tesla-p100`, as `admin pools` shows it) that exactly one pool has. Anything else
    is returned unchanged, for validate_spec to refuse."""
    if asked in pool_accelerators:
        return asked
    pools = sorted({pool for pool, accelerator in pool_accelerators.items() if accelerator == asked})
    if len(pools) > 1:
        raise InvalidArgument(f"accelerator {quote(asked)} is in several pools ({', '.join(pools)}): name the pool",
                              field="spec.accelerator")
    return pools[0] if pools else asked


def validate_spec(spec: SessionSpec, pools: Collection[str], catalog: ImageCatalog, max_runtime_limit_s: float) -> str:
    """Returns the resolved image version, or raises InvalidArgument naming the field."""
    if not spec.request_id.strip():
        raise InvalidArgument("request_id must not be empty", field="spec.request_id")
    if not spec.user_id.strip():
        raise InvalidArgument("user_id must not be empty", field="spec.user_id")
    if spec.accelerator not in pools:
        known = ", ".join(sorted(pools))
        raise InvalidArgument(f"unknown accelerator {quote(spec.accelerator)} (known: {known})", field="spec.accelerator")
    if spec.max_runtime_s < 0:
        raise InvalidArgument("max_runtime must not be negative", field="spec.max_runtime")
    if spec.max_runtime_s > max_runtime_limit_s:
        raise InvalidArgument(f"max_runtime exceeds the limit of {max_runtime_limit_s:.0f}s", field="spec.max_runtime")
    try:
        return catalog.resolve(spec.image)
    except InvalidArgument as err:
        raise InvalidArgument(err.message, field="spec.image") from None


def priority_class(spec: SessionSpec, priority: PriorityConfig) -> str:
    """The session's priority class: the one it names, or its kind's. A session may not name a
    class ranked above its kind's (a batch cannot make itself unpreemptible), and an interactive
    session's class is never preemptible."""
    own = priority.class_of(spec.kind.value)
    if not spec.priority_class:
        return own
    asked = priority.classes.get(spec.priority_class)
    if asked is None:
        raise InvalidArgument(f"unknown priority class {quote(spec.priority_class)} (classes: "
                              f"{', '.join(sorted(priority.classes))})", field="spec.priority_class")
    if asked.rank > priority.classes[own].rank:
        raise InvalidArgument(f"priority class {spec.priority_class} ranks above {own}, the class of "
                              f"{spec.kind.value} sessions", field="spec.priority_class")
    if spec.kind is SessionKind.INTERACTIVE and asked.preemptible:
        raise InvalidArgument(f"priority class {spec.priority_class} is preemptible; interactive sessions "
                              "are never preempted", field="spec.priority_class")
    return spec.priority_class
